"""What the reproductions in this folder share: ranks to run them on, and a late allreduce.

Each reproduction runs on Gloo ranks on this machine's CPU (2 unless it says otherwise),
checks a gradient of DistributedDataParallel against what a local copy of the module
computes, prints what each rank saw, and exits 1 if a rank saw a wrong result, 0 if none
did. The ranks wait for each other through the store of the default group, never for a
time.
"""

import copy
import datetime
import os
import signal
import sys
import tempfile
from typing import List, NamedTuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2
_results = None  # main()'s queue, in a rank


class RaiseInBackward(torch.autograd.Function):
    """Identity whose backward raises: applied to the input, once every parameter has its
    gradient; applied to the loss, before any has."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("a peer died")


def batch(rank, step):
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(100 * step + rank))


def expected_grads(module, step, ranks):
    """The average over ``ranks`` of the gradients that a local copy of ``module`` gets."""
    local = copy.deepcopy(module)
    total = [torch.zeros_like(p) for p in local.parameters()]
    for rank in ranks:
        grads = torch.autograd.grad(
            local(batch(rank, step)).pow(2).sum(), list(local.parameters())
        )
        total = [t + g for t, g in zip(total, grads)]
    return [t / len(ranks) for t in total]


class Gradients(NamedTuple):
    """How far the gradients of a step are from the right ones: the largest error, and the
    values of the parameter where it is, at the elements furthest off."""

    error: float
    name: str
    expected: List[float]
    got: List[float]


def compare(ddp, step, ranks):
    """The :class:`Gradients` of ``ddp`` after its step ``step`` over ``ranks``."""
    want = expected_grads(ddp.module, step, ranks)
    name, got, right = max(
        (
            (name, param.grad.flatten(), right.flatten())
            for (name, param), right in zip(ddp.module.named_parameters(), want)
        ),
        key=lambda name_got_right: (name_got_right[1] - name_got_right[2]).abs().max(),
    )
    error = (got - right).abs()
    furthest = error.topk(min(4, got.numel())).indices.sort().values
    return Gradients(
        error.max().item(), name, right[furthest].tolist(), got[furthest].tolist()
    )


def check(ddp, step, ranks):
    """The largest error of a gradient of ``ddp`` after its step ``step`` over ``ranks``."""
    return compare(ddp, step, ranks).error


def recover_and_step(ddp, old, rank, bucket):
    """Moves ``ddp`` from ``old`` to a new group of both ranks, and trains step 1, while the
    allreduce of the bucket at index ``bucket`` that rank 0's failed pass launched on
    ``old`` still waits for rank 1; returns the :class:`Gradients` of step 1.

    Rank 1 joins that allreduce late, as a slow peer does, once rank 0 has copied part of
    step 1's gradients into the bucket: rank 0 waits in a hook of the first layer's
    weight, whose gradient comes last, until the allreduce has completed.
    """
    store = dist.distributed_c10d._get_default_store()
    # Rank 1's side of the allreduce: its values stand for its gradients.
    late = torch.ones_like(ddp.reducer._get_zeros_like_grad_buckets()[bucket].buffer())
    ddp._update_process_group(dist.new_group([0, 1]))
    ddp.zero_grad(set_to_none=True)
    if rank == 0:

        def wait_for_the_late_allreduce(grad):
            store.set("rank 0 has filled part of the bucket", "")
            # Gloo's barrier waits for the collectives issued before it on this rank: the
            # failed pass's allreduce has written the bucket when it returns.
            dist.barrier(group=old)

        handle = ddp.module[0].weight.register_hook(wait_for_the_late_allreduce)
    else:
        store.wait(["rank 0 has filled part of the bucket"])
        dist.all_reduce(late, group=old)
        dist.barrier(group=old)
    ddp(batch(rank, 1)).pow(2).sum().backward()
    if rank == 0:
        handle.remove()
    return compare(ddp, 1, [0, 1])


def reconfigure(members, uuid):
    """Reconfigures the default group in place to ``members`` (ranks of the group as it
    was first reconfigured), on each of them, exchanging handles through the store."""
    store = dist.distributed_c10d._get_default_store()
    rank = int(os.environ["REPRO_RANK"])
    store.set(f"reconfigure/{uuid}/{rank}", dist._get_reconfigure_handle())
    handles = [store.get(f"reconfigure/{uuid}/{member}").decode() for member in members]
    dist._reconfigure(uuid=uuid, handles=handles).wait()


def die(rank):
    """Ends this rank as a killed process ends, after telling main() it did."""
    _results.put((rank, None))
    os.kill(os.getpid(), signal.SIGKILL)


def _rank(rank, body, init_file, results, world_size, in_place):
    global _results
    _results = results
    os.environ["REPRO_RANK"] = str(rank)
    # A group to reconfigure in place (torch 2.14), where a rank whose collective waits on
    # a survivor while a peer is gone fails once the group times out.
    in_place_options = (
        dict(timeout=datetime.timedelta(seconds=10), enable_reconfigure=True)
        if in_place
        else {}
    )
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world_size,
        **in_place_options,
    )
    if in_place:
        reconfigure(list(range(world_size)), uuid=0)
    torch.manual_seed(0)
    try:
        results.put((rank, body(rank)))
    finally:
        dist.destroy_process_group()


def main(title, body, world_size=WORLD_SIZE, in_place=False):
    """Runs ``body(rank)`` on every rank; it returns the largest gradient error it saw, or
    the :class:`Gradients` that say where.

    With ``in_place``, the default group can be reconfigured in place (see
    :func:`reconfigure`). ``body`` may end its rank with :func:`die`.
    """
    print(f"torch {torch.__version__}: {title}")
    with tempfile.TemporaryDirectory() as tmp:
        context = mp.get_context("spawn")
        results = context.SimpleQueue()
        ranks = mp.start_processes(
            _rank,
            args=(body, os.path.join(tmp, "init"), results, world_size, in_place),
            nprocs=world_size,
            start_method="spawn",
            join=False,
        )
        reported = dict(results.get() for _ in range(world_size))
        for process in ranks.processes:
            process.join()
    wrong = False
    for rank, result in sorted(reported.items()):
        if result is None:
            print(f"  rank {rank}: killed")
            continue
        error = result.error if isinstance(result, Gradients) else result
        wrong = wrong or error > 1e-4
        print(
            f"  rank {rank}: largest error of a gradient in the step after recovering: {error:.3g}"
        )
        if isinstance(result, Gradients) and error > 1e-4:
            print(
                f"    {result.name}, where it is furthest off: "
                f"expected {_values(result.expected)}, got {_values(result.got)}"
            )
    print(
        "WRONG: the gradients are not the average over the ranks"
        if wrong
        else "ok: the gradients are right"
    )
    sys.exit(1 if wrong else 0)


def _values(values):
    return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"
