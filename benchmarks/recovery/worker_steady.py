"""A rank of the steady-step comparison, stock DDP or the series:
``python -m benchmarks.recovery.worker_steady``."""

import sys
import time

import torch.distributed as dist

from benchmarks.recovery import worker
from torch.nn.parallel import DistributedDataParallel


def main(args) -> int:
    """Train --warmup steps, then time --steps steps, with nothing else per step."""
    process = worker.Process(args)
    process.init_whole_group("steady")
    net = process.compile_net(DistributedDataParallel(process.model))
    times = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        process.train_step(net, step)
        times.append(time.perf_counter() - start)
    # Which DDP ran: the series adds this method, stock DDP has none.
    series = hasattr(DistributedDataParallel, "_agree_on_process_group_update")
    process.events.log("steady", times=times[args.warmup :], series=series)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(worker.run(main))
