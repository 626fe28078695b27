#!/usr/bin/env python3
"""A backward pass raises after it launched its allreduce, which is still running.

The ranks recover with DistributedDataParallel._update_process_group() and train on.
The allreduce of the failed pass is held back (examples/repro/common.py), and lands
while the next step's backward pass fills the same bucket, as a slow or dying peer's
collective does. Upstream's reset_state() leaves the bucket's storage in place, so the
next step's gradients are wrong on every rank, without an error.
"""

import torch
import torch.distributed as dist
from common import HeldGroup, main, RaiseInBackward, recover_and_step
from torch.nn.parallel import DistributedDataParallel


def body(rank):
    old = HeldGroup(dist.new_group([0, 1]))
    ddp = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 3)),
        process_group=old,
    )
    old.holding = True
    try:
        ddp(
            RaiseInBackward.apply(torch.ones(4, 6, requires_grad=True))
        ).sum().backward()
    except RuntimeError:
        pass  # the backward pass raised; its allreduce is in flight
    return recover_and_step(ddp, old, rank)


if __name__ == "__main__":
    main(
        "the allreduce of a failed backward pass writes into the next step's gradients",
        body,
    )
