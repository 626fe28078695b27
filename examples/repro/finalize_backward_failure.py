#!/usr/bin/env python3
"""A backward pass fails in finalize_backward(), where it waits for its first bucket.

That bucket's allreduce failed, as Gloo's does when a peer is gone; the second bucket's
is still running (held back, examples/repro/common.py). The ranks recover with
DistributedDataParallel._update_process_group() and train on, and the second bucket's
allreduce lands while the next step fills that bucket. Upstream's reset_state() takes
the failed pass for a finished one and leaves the bucket in place, so the next step's
gradients are wrong on every rank, without an error.
"""

from unittest import mock

import torch
import torch.distributed as dist
from common import HeldGroup, main, recover_and_step
from torch.nn.parallel import DistributedDataParallel


def body(rank):
    old = HeldGroup(dist.new_group([0, 1]))
    module = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 3))
    # Small buckets: one for each layer.
    with mock.patch.object(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 100):
        ddp = DistributedDataParallel(
            module, process_group=old, bucket_cap_mb=1e-4, find_unused_parameters=True
        )
    assert len(ddp.reducer._get_zeros_like_grad_buckets()) > 1
    old.holding = True
    old.fail_first = True
    try:
        ddp(torch.ones(4, 6)).sum().backward()
    except RuntimeError:
        pass  # finalize_backward() raised; the other buckets' allreduces are in flight
    return recover_and_step(ddp, old, rank)


if __name__ == "__main__":
    main(
        "the allreduces that a failed finalize_backward() did not wait for write into the next step",
        body,
    )
