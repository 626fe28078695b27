"""What the reproductions in this folder share: ranks to run them on, and a held collective.

Each reproduction runs on Gloo ranks on this machine's CPU (2 unless it says otherwise),
checks a gradient of DistributedDataParallel against what a local copy of the module
computes, prints what each rank saw, and exits 1 if a rank saw a wrong result, 0 if none
did.
"""

import copy
import datetime
import os
import signal
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch._C._distributed_c10d import _create_work_from_future

WORLD_SIZE = 2
_results = None  # main()'s queue, in a rank


class HeldGroup(dist.ProcessGroup):
    """A process group whose allreduces run on ``inner``, or are held back while ``holding``.

    A held allreduce is the collective of a backward pass whose peer died, or is
    slow: it has not completed, and it may still write its tensors in place, at any
    time. ``release()`` does that write (ten times the values, a result that no
    correct allreduce gives) and completes it. ``fail_first`` makes the first held
    allreduce fail instead, as Gloo's does when a peer is gone.
    """

    def __init__(self, inner):
        super().__init__(inner.rank(), inner.size())
        self.inner = inner
        self.holding = False
        self.fail_first = False
        self.held = []

    def getBackendName(self):
        return "held"

    def allreduce(self, tensors, opts=None):
        if not self.holding:
            return self.inner.allreduce(tensors, opts or dist.AllreduceOptions())
        if self.fail_first:
            self.fail_first = False
            return FailedWork()
        future = torch.futures.Future()
        self.held.append((tensors, future))
        return _create_work_from_future(future)

    def allgather(self, output_tensors, input_tensors, opts=None):
        return self.inner.allgather(
            output_tensors,
            input_tensors,
            opts or dist.distributed_c10d.AllgatherOptions(),
        )

    def broadcast(self, tensors, opts=None):
        return self.inner.broadcast(
            tensors, opts or dist.distributed_c10d.BroadcastOptions()
        )

    @torch.no_grad()
    def release(self):
        for tensors, future in self.held:
            for t in tensors:
                t.mul_(10)
            future.set_result(tensors)
        self.held = []


class FailedWork(dist.Work):
    """The work of an allreduce that failed: its wait() and its future raise."""

    def __init__(self):
        super().__init__()

        def fail(_):
            raise RuntimeError("the allreduce failed: a peer is gone")

        source = torch.futures.Future()
        self._future = source.then(fail)
        source.set_result(None)

    def wait(self, timeout=None):
        raise RuntimeError("the allreduce failed: a peer is gone")

    def get_future(self):
        return self._future


class RaiseInBackward(torch.autograd.Function):
    """Identity whose backward raises, after every parameter has its gradient."""

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


def check(ddp, step, ranks):
    """The largest error of a gradient of ``ddp`` after its step ``step`` over ``ranks``."""
    want = expected_grads(ddp.module, step, ranks)
    return max(
        (p.grad - w).abs().max().item() for p, w in zip(ddp.module.parameters(), want)
    )


def recover_and_step(ddp, old, rank):
    """Moves ``ddp`` to a new group of both ranks and trains step 1, while ``old`` holds
    the failed pass's allreduces back until this step's last gradient arrives; returns
    the largest error of a gradient (see :func:`check`)."""
    ddp._update_process_group(dist.new_group([0, 1]))
    ddp.zero_grad(set_to_none=True)
    handle = ddp.module[0].weight.register_hook(lambda grad: old.release())
    ddp(batch(rank, 1)).pow(2).sum().backward()
    handle.remove()
    return check(ddp, 1, [0, 1])


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
    """Runs ``body(rank)`` on every rank; it returns the largest gradient error it saw.

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
    errors = {rank: error for rank, error in reported.items() if error is not None}
    wrong = {rank: error for rank, error in sorted(errors.items()) if error > 1e-4}
    for rank, error in sorted(reported.items()):
        if error is None:
            print(f"  rank {rank}: killed")
        else:
            print(
                f"  rank {rank}: largest error of a gradient in the step after recovering: {error:.3g}"
            )
    print(
        "WRONG: the gradients are not the average over the ranks"
        if wrong
        else "ok: the gradients are right"
    )
    sys.exit(1 if wrong else 0)
