#!/usr/bin/env python3
"""Ranks that rebuilt their buckets apart meet in a new group, and reduce mismatched buckets.

Rank 0 trains alone in a group of its own, and rebuilds its bucket from the order its
gradients come in; rank 1 is outside that group, with the bucket that the constructor
made in the reverse order of the parameters. Both then move to a group of the two with
DistributedDataParallel._update_process_group(). The module's two layers have the same
sizes, so the buckets do too, with each layer at the other's offset: the first step's
allreduce sums one rank's gradients of one layer with the other rank's of the other.
Upstream's update does not align the buckets, so that step's gradients are wrong on
both ranks, without an error. (With layers of other sizes, Gloo aborts the process.)
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import batch, check, main
from torch.nn.parallel import DistributedDataParallel


class OutOfOrder(torch.nn.Module):
    """Two layers of the same sizes, used in the reverse of their order here."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(6, 6)
        self.second = torch.nn.Linear(6, 6)

    def forward(self, x):
        return self.first(F.relu(self.second(x)))


def body(rank):
    ddp = DistributedDataParallel(OutOfOrder())
    alone = [dist.new_group([0]), dist.new_group([1])]
    both = dist.new_group([0, 1])
    ddp._update_process_group(
        alone[0] if rank == 0 else dist.GroupMember.NON_GROUP_MEMBER
    )
    if rank == 0:
        for step in range(
            2
        ):  # the first backward pass records the order; the next forward rebuilds
            ddp.zero_grad(set_to_none=True)
            ddp(batch(rank, 0)).pow(2).sum().backward()
    ddp._update_process_group(both)
    ddp.zero_grad(set_to_none=True)
    ddp(batch(rank, 1)).pow(2).sum().backward()
    return check(ddp, 1, [0, 1])


if __name__ == "__main__":
    main("ranks whose buckets were rebuilt apart reduce mismatched buckets", body)
