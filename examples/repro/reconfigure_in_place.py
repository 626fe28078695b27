#!/usr/bin/env python3
"""A peer dies in a backward pass, and the survivors reconfigure their group in place.

4 Gloo ranks train a DistributedDataParallel module on a group that can be reconfigured
in place (init_process_group(..., enable_reconfigure=True), torch 2.14). Rank 3 is
killed in the backward pass of step 1. The others catch the error, reconfigure the same
group to the 3 of them with torch.distributed._reconfigure(), and train step 2. DDP does
not know that its group changed: upstream divides step 2's gradients by the old size, 4,
so they are 3/4 of the average over the 3 ranks on every rank, without an error.

With the fix, the forward pass of step 2 raises an error that names
_update_process_group(); after that call, step 2's gradients are right.
"""

import torch
import torch.distributed as dist
from common import batch, check, die, main, reconfigure
from torch.nn.parallel import DistributedDataParallel


def body(rank):
    group = dist.group.WORLD
    ddp = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 3))
    )
    ddp(batch(rank, 0)).pow(2).sum().backward()
    if rank == 3:
        ddp.module[0].weight.register_hook(lambda grad: die(rank))
    try:
        ddp(batch(rank, 1)).pow(2).sum().backward()
    except RuntimeError:
        pass  # the allreduce of step 1 failed: rank 3 is gone
    reconfigure([0, 1, 2], uuid=1)
    ddp.zero_grad(set_to_none=True)
    try:
        loss = ddp(batch(rank, 2)).pow(2).sum()
    except RuntimeError as e:
        print(
            f"  rank {rank}: the forward pass raised: {str(e).splitlines()[0][:100]}...\n",
            end="",
            flush=True,
        )
        ddp._update_process_group(group)
        loss = ddp(batch(rank, 2)).pow(2).sum()
    loss.backward()
    return check(ddp, 2, [0, 1, 2])


if __name__ == "__main__":
    main(
        "a group reconfigured in place: DDP divides the gradients by its old size",
        body,
        world_size=4,
        in_place=True,
    )
