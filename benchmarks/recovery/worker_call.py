"""A rank that times _update_process_group() against its collectives alone:
``python -m benchmarks.recovery.worker_call``."""

import statistics
import sys
import time
from typing import List, Optional

import torch
import torch.distributed as dist

from benchmarks.recovery import worker
from benchmarks.recovery.cells import CALL_MODES
from torch.nn.parallel import DistributedDataParallel


class RecordingGroup(dist.ProcessGroup):
    """Runs the collectives of ``inner`` and records each: its kind, its tensors, its root."""

    def __init__(self, inner):
        super().__init__(inner.rank(), inner.size())
        self.inner = inner
        self.recorded = []

    def getBackendName(self):
        return "recording"

    def allreduce(self, tensors, opts=None):
        self.recorded.append(("allreduce", [t.clone() for t in tensors], None))
        return self.inner.allreduce(tensors, opts or dist.AllreduceOptions())

    def allgather(self, output_tensors, input_tensors, opts=None):
        self.recorded.append(("allgather", [t.clone() for t in input_tensors], None))
        return self.inner.allgather(
            output_tensors,
            input_tensors,
            opts or dist.distributed_c10d.AllgatherOptions(),
        )

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.distributed_c10d.BroadcastOptions()
        self.recorded.append(("broadcast", [t.clone() for t in tensors], opts.rootRank))
        return self.inner.broadcast(tensors, opts)


def run_collective(
    group, kind: str, tensors: List[torch.Tensor], root: Optional[int]
) -> None:
    """Run one recorded collective on ``group`` and wait for it."""
    if kind == "allreduce":
        group.allreduce(tensors, dist.AllreduceOptions()).wait()
    elif kind == "allgather":
        outputs = [[torch.empty_like(t) for _ in range(group.size())] for t in tensors]
        group.allgather(
            outputs, tensors, dist.distributed_c10d.AllgatherOptions()
        ).wait()
    else:
        opts = dist.distributed_c10d.BroadcastOptions()
        opts.rootRank = root
        group.broadcast(tensors, opts).wait()


def main(args) -> int:
    """Time _update_process_group() onto a new group of the same ranks, then its collectives alone."""
    process = worker.Process(args)
    process.init_whole_group("call")
    ddp = DistributedDataParallel(process.model)
    for step in range(3):  # past the first iteration, which rebuilds the buckets
        process.train_step(ddp, step)
    results = {}
    for sync in (False, True):
        # What the call sends, recorded once through a group that forwards to a real one.
        recorder = RecordingGroup(dist.new_group(list(range(args.world))))
        ddp._update_process_group(recorder, sync_module_states=sync)
        calls = []
        for _ in range(args.repeats):
            group = dist.new_group(list(range(args.world)))
            dist.barrier()
            start = time.perf_counter()
            ddp._update_process_group(group, sync_module_states=sync)
            calls.append(time.perf_counter() - start)
        group = dist.new_group(list(range(args.world)))
        collectives = []
        for kind, tensors, root in recorder.recorded:
            alone = []
            for _ in range(args.repeats):
                dist.barrier()
                start = time.perf_counter()
                run_collective(group, kind, tensors, root)
                alone.append(time.perf_counter() - start)
            collectives.append(
                {
                    "kind": kind,
                    "bytes": sum(t.numel() * t.element_size() for t in tensors),
                    "s": statistics.median(alone),
                }
            )
        results[CALL_MODES[sync]] = {
            "call_s": statistics.median(calls),
            "collectives": collectives,
        }
    process.events.log("call", results=results)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(worker.run(main))
