#!/usr/bin/env python3
"""A backward pass raises after it launched its allreduce, which a slow peer joins later.

Two Gloo ranks train a DistributedDataParallel module on a group of their own. In step 0,
rank 0's backward pass launches the allreduce of its bucket and then raises; rank 1's
raises at once, before its own. The ranks recover with
DistributedDataParallel._update_process_group() on a new group and train step 1. Rank 1
joins the allreduce of step 0 on the old group while rank 0's step 1 fills the same
bucket (examples/repro/common.py), as a slow peer's data arrives. Upstream's
reset_state() leaves the bucket's storage in place, so the old allreduce writes over
step 1's gradients, and they are wrong on every rank, without an error.
"""

import torch
import torch.distributed as dist
from common import batch, main, RaiseInBackward, recover_and_step
from torch.nn.parallel import DistributedDataParallel


def body(rank):
    old = dist.new_group([0, 1])
    ddp = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 3)),
        process_group=old,
    )
    inputs = batch(rank, 0).requires_grad_()
    try:
        if rank == 0:
            ddp(RaiseInBackward.apply(inputs)).pow(2).sum().backward()
        else:
            RaiseInBackward.apply(ddp(inputs).pow(2).sum()).backward()
    except RuntimeError:
        pass  # rank 0's allreduce waits for rank 1's, on the old group
    return recover_and_step(ddp, old, rank, bucket=0)


if __name__ == "__main__":
    main(
        "the allreduce of a failed backward pass writes into the next step's gradients",
        body,
    )
