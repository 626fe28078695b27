"""One rank (world size 1, Gloo) that trains a fixed number of steps between two callgrind
client requests, so that callgrind counts the instructions of those steps alone:
``python -m benchmarks.recovery.worker_instructions``, under valgrind, stock or the series.

With --time-check instead, outside valgrind, it times the forward pass's reconfigure check of
the series alone, as DDP's forward makes it on every step: two getters of the process group
(its reconfigure generation and its size), each compared with what DDP recorded.
"""

import argparse
import ctypes
import json
import sys
import timeit

import torch
import torch.distributed as dist
import torch.nn as nn
from benchmarks.model import LanguageModel, SIZES

from benchmarks.recovery.worker import make_batch
from torch.nn.parallel import DistributedDataParallel

WARMUP = 3
# The series' check that DDP's forward makes on every step, which --time-check times.
CHECK = "_check_process_group_not_reconfigured"


def build(size: str):
    """Return a DDP module on a Gloo group of this process alone, Adam and the loss."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(0)
    model = LanguageModel(SIZES[size])
    return (
        DistributedDataParallel(model),
        torch.optim.Adam(model.parameters(), lr=1e-3),
        nn.CrossEntropyLoss(),
    )


def count_steps(args) -> dict:
    """Train WARMUP steps, then --steps steps between the client requests of --helper."""
    ddp, optimizer, loss_fn = build(args.size)
    helper = ctypes.CDLL(args.helper)

    def train_step(step: int) -> None:
        inputs, targets = make_batch(step, 0)
        loss_fn(ddp(inputs).flatten(0, 1), targets.flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for step in range(WARMUP):
        train_step(step)
    helper.steps_begin()
    for step in range(WARMUP, WARMUP + args.steps):
        train_step(step)
    helper.steps_end()
    dist.destroy_process_group()
    series = hasattr(DistributedDataParallel, "_agree_on_process_group_update")
    return {"series": series, "steps": args.steps}


def time_check(args, number: int = 1_000_000) -> dict:
    """Time the series' forward-pass check of its process group against an empty statement,
    ``number`` calls each; None without it."""
    if not hasattr(DistributedDataParallel, CHECK):
        return {"check_s": None, "why": f"this DDP has no {CHECK}()"}
    ddp, _, _ = build(args.size)
    statement = f"ddp.{CHECK}()"
    check = min(timeit.repeat(statement, globals={"ddp": ddp}, number=number, repeat=5))
    empty = min(timeit.repeat("pass", number=number, repeat=5))
    dist.destroy_process_group()
    return {"check_s": max(0.0, check - empty) / number, "expression": statement}


def main() -> int:
    parser = argparse.ArgumentParser(
        description="A rank of the recovery benchmark's instruction count; the driver "
        "(python -m benchmarks.recovery) starts it under callgrind."
    )
    parser.add_argument("--size", required=True, choices=sorted(SIZES))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--helper", help="the shared library of the client requests")
    parser.add_argument("--out", required=True, help="where the JSON result goes")
    parser.add_argument("--time-check", action="store_true")
    args = parser.parse_args()
    result = time_check(args) if args.time_check else count_steps(args)
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
