"""What DistributedDataParallel._update_process_group() costs at scale, on a simulated world.

One process: DDP trains on a real one-rank Gloo group, then moves to a simulated group of N
ranks (SimulatedGroup), which answers every collective as N ranks holding the same model and
the same state would, and records it. For each N, the call's collective rounds, the payload
bytes a rank sends and receives (what the collectives' API takes and returns, not wire bytes),
and the call's local time (the median of --repeats calls; the simulated collectives take next
to no time).

  python -m benchmarks.update_process_group_scale --ranks 8 256 2048 --parameters 5000
"""

import argparse
import dataclasses
import json
import pathlib
import statistics
import sys
import time
from typing import Dict, List

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.nn.parallel import DistributedDataParallel

RESULTS = (
    pathlib.Path(__file__).resolve().parent
    / "results"
    / "update_process_group_scale.json"
)


@dataclasses.dataclass
class Collective:
    """One collective of the call, as one rank other than the root sees it."""

    kind: str
    sent: int
    received: int


def _complete_at_once(tensors):
    future = torch.futures.Future()
    future.set_result(tensors)
    return _create_work_from_future(future)


def _count_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class SimulatedGroup(dist.ProcessGroup):
    """Rank 0 of ``size`` ranks that hold what this one holds: each collective completes at
    once with what those ranks would contribute, and is recorded."""

    def __init__(self, size: int):
        super().__init__(0, size)
        self.recorded: List[Collective] = []

    def getBackendName(self):
        return "simulated"

    def broadcast(self, tensors, opts=None):
        self.recorded.append(Collective("broadcast", 0, _count_bytes(tensors)))
        return _complete_at_once(tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        for outputs, tensor in zip(output_tensors, input_tensors):
            for output in outputs:
                output.copy_(tensor)
        sent = _count_bytes(input_tensors)
        self.recorded.append(Collective("allgather", sent, sent * self.size()))
        return _complete_at_once(output_tensors)

    def allreduce(self, tensors, opts=None):
        for tensor in tensors:
            tensor.mul_(self.size())
        self.recorded.append(
            Collective("allreduce", _count_bytes(tensors), _count_bytes(tensors))
        )
        return _complete_at_once(tensors)


def make_ddp(parameters: int) -> DistributedDataParallel:
    """Make DDP on a one-rank Gloo group, past the iteration that rebuilds its buckets, with
    ``parameters`` parameters (Linear(4, 4) layers, a weight and a bias each)."""
    if not dist.is_initialized():
        # A store in this process: torch 2.1's tcp:// rendezvous takes no port 0.
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[torch.nn.Linear(4, 4) for _ in range(parameters // 2)]
    )
    ddp = DistributedDataParallel(model)
    for _ in range(2):
        ddp(torch.randn(2, 4)).sum().backward()
    return ddp


def measure(
    ddp: DistributedDataParallel, ranks: int, repeats: int, sync_module_states: bool
) -> Dict:
    """Return the rounds, payloads and local time of a call onto ``ranks`` simulated ranks."""
    times, recorded = [], []
    for _ in range(repeats):
        group = SimulatedGroup(ranks)
        start = time.perf_counter()
        ddp._update_process_group(group, sync_module_states=sync_module_states)
        times.append(time.perf_counter() - start)
        recorded = group.recorded
    return {
        "ranks": ranks,
        "parameters": sum(1 for _ in ddp.parameters()),
        "sync_module_states": sync_module_states,
        "rounds": len(recorded),
        "collectives": [dataclasses.asdict(c) for c in recorded],
        "sent_bytes": sum(c.sent for c in recorded),
        "received_bytes": sum(c.received for c in recorded),
        "call_s": statistics.median(times),
    }


def format_table(rows: List[Dict]) -> str:
    """Format ``rows`` as a markdown table."""
    lines = [
        "| ranks | parameters | sync_module_states | rounds | sent per rank | received per rank | call (local) |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['ranks']} | {r['parameters']} | {r['sync_module_states']} | "
            f"{r['rounds']} | {r['sent_bytes']:,} B | {r['received_bytes']:,} B | "
            f"{r['call_s'] * 1e3:.1f} ms |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.update_process_group_scale",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 256, 2048])
    parser.add_argument("--parameters", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--output", type=pathlib.Path, default=RESULTS, help="the JSON it writes"
    )
    args = parser.parse_args(argv)
    print(
        f"[scale] DDP with {args.parameters} parameters on a one-rank Gloo group",
        file=sys.stderr,
    )
    ddp = make_ddp(args.parameters)
    rows = []
    for sync in (False, True):
        for ranks in args.ranks:
            print(f"[scale] {ranks} ranks, sync_module_states={sync}", file=sys.stderr)
            rows.append(measure(ddp, ranks, args.repeats, sync))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps({"torch": torch.__version__, "rows": rows}, indent=1) + "\n"
    )
    print(format_table(rows))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
