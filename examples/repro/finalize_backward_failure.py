#!/usr/bin/env python3
"""A backward pass fails in finalize_backward(), where it waits for its first bucket.

Two Gloo ranks train a DistributedDataParallel module with two buckets on a group of
their own. DDP's allreduce runs in a communication hook, on the group the module is on.
In step 0, on rank 0, the first bucket's future fails, as a hook's does when its
collective fails, and the second bucket's allreduce waits for rank 1, whose backward
pass raised at once. finalize_backward() raises at the first bucket. The ranks recover
with DistributedDataParallel._update_process_group() on a new group and train step 1;
rank 1 joins the second bucket's allreduce on the old group while rank 0's step 1 fills
that bucket (examples/repro/common.py), as a slow peer's data arrives. Upstream's
reset_state() takes the failed pass for a finished one and leaves the bucket in place,
so the old allreduce writes over step 1's gradients, and they are wrong on every rank,
without an error.
"""

import torch
import torch.distributed as dist
from common import batch, main, RaiseInBackward, recover_and_step
from torch.nn.parallel import DistributedDataParallel


def failed_allreduce():
    """The future of an allreduce that failed, as a hook's is when a peer is gone: its
    wait() in finalize_backward() raises."""

    def fail(_):
        raise RuntimeError("the first bucket's allreduce failed: a peer is gone")

    # A future whose callback raised holds the error where C++ waits for it;
    # Future.set_exception() would only make Python's wait() raise.
    launched = torch.futures.Future()
    launched.set_result(None)
    return launched.then(fail)


def body(rank):
    old = dist.new_group([0, 1])
    # Two buckets: the last layer's bias, then the other parameters. The caps go to the
    # buckets from the first parameter on, and the first bucket to be reduced is the last.
    ddp = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 3)),
        process_group=old,
        bucket_cap_mb_list=[3e-4, 25],
    )
    failing = rank == 0

    def allreduce(state, bucket):
        if failing and bucket.index() == 0:
            return failed_allreduce()
        group = ddp.process_group
        work = dist.all_reduce(
            bucket.buffer().div_(group.size()), group=group, async_op=True
        )
        return work.get_future().then(lambda future: future.value()[0])

    ddp.register_comm_hook(None, allreduce)
    assert [
        len(bucket.parameters())
        for bucket in ddp.reducer._get_zeros_like_grad_buckets()
    ] == [1, 3]
    loss = ddp(batch(rank, 0)).pow(2).sum()
    try:
        (loss if rank == 0 else RaiseInBackward.apply(loss)).backward()
    except RuntimeError:
        pass  # rank 0's second allreduce waits for rank 1's, on the old group
    failing = False
    return recover_and_step(ddp, old, rank, bucket=1)


if __name__ == "__main__":
    main(
        "the allreduces that a failed finalize_backward() did not wait for write into the next step",
        body,
    )
