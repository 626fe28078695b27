# Owner(s): ["oncall: distributed"]

import contextlib
import copy
import dataclasses
import os
import pickle
import sys
import threading
import time
import warnings
import weakref
from datetime import timedelta
from typing import List, Tuple
from unittest import mock

import hypothesis
import hypothesis.strategies as st

import torch
import torch.distributed as dist

if not dist.is_available():
    print("Distributed not available, skipping tests", file=sys.stderr)
    sys.exit(0)

import torch._dynamo
import torch._dynamo.testing
import torch.nn as nn
import torch.nn.functional as F
from torch._C._distributed_c10d import _create_work_from_future
from torch.distributed.algorithms.ddp_comm_hooks import (
    default_hooks,
    post_localSGD_hook,
    powerSGD_hook,
)
from torch.nn.parallel import DistributedDataParallel
from torch.testing._internal.common_distributed import (
    MultiProcessTestCase,
    requires_gloo,
    requires_nccl,
)
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    skip_but_pass_in_sandcastle_if,
    TEST_WITH_DEV_DBG_ASAN,
)

if TEST_WITH_DEV_DBG_ASAN:
    print(
        "Skip dev-asan as torch + multiprocessing spawn have known issues",
        file=sys.stderr,
    )
    sys.exit(0)


class SimulatedError(RuntimeError):
    pass


class _RaiseInBackward(torch.autograd.Function):
    """Identity whose backward raises.

    Applied to the input, its backward runs after every parameter's
    AccumulateGrad, which the autograd engine runs as soon as they are ready.
    """

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise SimulatedError("simulated failure in backward")


class Net(nn.Module):
    """Three layers; ``fc2`` can be left out of the graph to leave it unused."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 8)
        self.fc3 = nn.Linear(8, 3)

    def forward(self, x, use_fc2=True):
        h = F.relu(self.fc1(x))
        if use_fc2:
            h = F.relu(self.fc2(h))
        return self.fc3(h)


class NetWithBuffer(Net):
    """``Net`` with a buffer that forward writes, for ``broadcast_buffers``."""

    def __init__(self):
        super().__init__()
        self.register_buffer("last_mean", torch.zeros(3))

    def forward(self, x, use_fc2=True):
        out = super().forward(x, use_fc2)
        self.last_mean.copy_(out.detach().mean(0))
        return out


class NetWithSparseEmbedding(Net):
    """``Net`` whose input also goes through an embedding with sparse gradients."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 6, sparse=True)

    def forward(self, x, use_fc2=True):
        ids = (x.detach().abs() * 3).long().clamp(max=9)
        return super().forward(x + self.emb(ids).mean(1), use_fc2)


class NetOutOfOrder(nn.Module):
    """Two layers of the same sizes, used in the reverse of their order here.

    The constructor puts their parameters in one bucket in the reverse of this
    order, and the bucket rebuilt after the first backward pass holds them in
    the order their gradients came: the same sizes, at other offsets.
    """

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(6, 6)
        self.second = nn.Linear(6, 6)

    def forward(self, x, use_fc2=True):
        return self.first(F.relu(self.second(x)))


class NetWithSyncBatchNorm(Net):
    """``Net`` with ``SyncBatchNorm`` layers: on DDP's group, on the default group, on another."""

    def __init__(self):
        super().__init__()
        self.bn = nn.SyncBatchNorm(8)
        self.default_bn = nn.SyncBatchNorm(8)
        self.own_bn = nn.SyncBatchNorm(8)

    def forward(self, x, use_fc2=True):
        h = self.own_bn(self.default_bn(self.bn(F.relu(self.fc1(x)))))
        if use_fc2:
            h = F.relu(self.fc2(h))
        return self.fc3(h)


def _sample(owner, step, device):
    """The batch that the process with original rank ``owner`` trains on at ``step``."""
    gen = torch.Generator().manual_seed(1000 * step + owner)
    return torch.randn(4, 6, generator=gen).to(device)


def _loss(out):
    return out.pow(2).sum()


class _HeldWork(dist.Work):
    """The work of a collective that the test holds, or fails.

    It never reports completion (``is_completed()``), as NCCL's work does not
    until its kernel has ended, whatever its future says.
    """

    def __init__(self, future):
        super().__init__()
        self._future = future

    def wait(self, timeout=None):
        self._future.wait()
        return True

    def get_future(self):
        return self._future


class _FailedWork(_HeldWork):
    """The work of a collective that failed, as a Gloo peer that died fails it.

    Its wait() raises, and its future holds the error, for C++ as for Python:
    Future.set_exception() would store the exception as the future's value,
    which only Python raises.
    """

    def __init__(self):
        def fail(_):
            raise SimulatedError("simulated failed collective")

        source = torch.futures.Future()
        super().__init__(source.then(fail))
        source.set_result(None)

    def wait(self, timeout=None):
        raise SimulatedError("simulated failed collective")


@torch.no_grad()
def _write_late(t):
    """Writes into ``t`` as a collective of a failed pass would, long after.

    On CUDA it writes on a stream of its own, as NCCL does, after everything
    enqueued so far.
    """
    if not t.is_cuda:
        stream = None
    else:
        stream = torch.cuda.Stream(t.device)
        stream.wait_stream(torch.cuda.current_stream(t.device))
    with torch.cuda.stream(stream) if stream else contextlib.nullcontext():
        if t.dtype == torch.int:
            t.fill_(1)
        else:
            t.mul_(1e6)
    if stream:
        t.record_stream(stream)


def _memory(t):
    return (t._values() if t.is_sparse else t).untyped_storage().data_ptr()


class _HeldGroup(dist.ProcessGroup):
    """A process group that runs its collectives on ``inner``, or holds them back.

    While ``holding``, an allreduce does not run: it returns a work that is
    pending, as the collective of a backward pass whose peer died is. Such a
    collective may still complete later and write its tensors in place. Here
    it does when the test calls :meth:`release`, or, after
    ``release_before(other)``, just before ``other`` runs an allreduce of the
    same memory: the worst moment, as the next iteration's own collective of
    those tensors starts. A released collective writes ``1e6`` times the
    values, or ones into a map of used parameters (see :func:`_write_late`).

    ``complete_on_enqueue`` completes a held work's future at once, as NCCL
    does when it enqueues a collective, although its write comes later; on
    CUDA, where that future's devices say so, unless ``future_devices`` is
    False: a future without devices, as a Python process group or hook can
    complete, orders no stream after the write.
    ``plan`` says what happens to the allreduces while holding, in order:
    ``"run"`` (on ``inner``, which completes it when it does), ``"done"``
    (the same, completed before the work is returned), ``"hold"``, or
    ``"fail"``, as a collective that reports an error when it is waited on
    does; those after the ones it lists are held.

    Allgathers and broadcasts always run, except that ``fail_collective``
    fails the first for which it returns True, called with the collective's
    kind (``"allgather"`` or ``"broadcast"``) and its input tensors, and
    ``edit_collective = (match, fn)`` calls ``fn`` on the tensors that the
    first match received, once it completes, as data corrupted in flight.
    """

    def __init__(self, inner):
        super().__init__(inner.rank(), inner.size())
        self.inner = inner
        self.holding = False
        self.complete_on_enqueue = False
        self.future_devices = True
        self.plan = []
        self.held = []
        self.released = 0
        self._release_into = []
        self.fail_collective = None
        self.edit_collective = (None, None)
        # Every Python work this group returned. Release 2.1's bindings keep a
        # Python work's methods only while Python refers to it: a work that only
        # C++ holds would wait in Work::wait() for good.
        self._works = []

    def _keep(self, work):
        self._works.append(work)
        return work

    def getBackendName(self):
        # Not the inner group's name, whose backend objects this group lacks.
        return "held"

    def allreduce(self, tensors, opts=None):
        for other in self._release_into:
            other.release(sharing_memory_with=tensors)
        step = (self.plan.pop(0) if self.plan else "hold") if self.holding else "run"
        if step in ("run", "done"):
            work = self.inner.allreduce(tensors, opts or dist.AllreduceOptions())
            if step == "done":
                work.wait()
            return work
        if step == "fail":
            return self._keep(_FailedWork())
        cuda = [t.device for t in tensors if t.is_cuda and self.future_devices]
        future = torch.futures.Future(devices=cuda or None)
        if self.complete_on_enqueue:
            future.set_result(tensors)
        self.held.append((tensors, future))
        return self._keep(_HeldWork(future))

    def allgather(self, output_tensors, input_tensors, opts=None):
        if self._fails("allgather", input_tensors):
            return self._keep(_FailedWork())
        work = self.inner.allgather(
            output_tensors,
            input_tensors,
            opts or torch._C._distributed_c10d.AllgatherOptions(),
        )
        return self._edited("allgather", input_tensors, output_tensors[0], work)

    def broadcast(self, tensors, opts=None):
        if self._fails("broadcast", tensors):
            return self._keep(_FailedWork())
        work = self.inner.broadcast(
            tensors, opts or torch._C._distributed_c10d.BroadcastOptions()
        )
        return self._edited("broadcast", tensors, tensors, work)

    def _fails(self, kind, inputs):
        """Whether ``fail_collective`` fails this collective: the first it matches."""
        if self.fail_collective is None or not self.fail_collective(kind, inputs):
            return False
        self.fail_collective = None
        return True

    def _edited(self, kind, inputs, received, work):
        """``work``, or, for the first match of ``edit_collective``, its edited result."""
        match, edit = self.edit_collective
        if match is None or not match(kind, inputs):
            return work
        self.edit_collective = (None, None)
        work.wait()
        edit(received)
        done = torch.futures.Future()
        done.set_result(received)
        return _create_work_from_future(done)

    def release_before(self, other):
        other._release_into.append(self)

    def release(self, sharing_memory_with=None):
        """Completes the held collectives, or those that write this memory."""
        memory = {_memory(t) for t in sharing_memory_with or ()}
        pending = []
        for tensors, future in self.held:
            if memory and not memory & {_memory(t) for t in tensors}:
                pending.append((tensors, future))
                continue
            for t in tensors:
                _write_late(t)
            if not future.done():
                future.set_result(tensors)
            self.released += 1
        self.held = pending


def _nth(kind, n):
    """For ``fail_collective`` and ``edit_collective``: the ``n``-th collective of ``kind``, from 1."""
    seen = 0

    def match(collective_kind, inputs):
        nonlocal seen
        seen += collective_kind == kind
        return collective_kind == kind and seen == n

    return match


def _reversed_buckets(sizes, indices):
    """The buckets of a bucket assignment's sizes and indices, in reverse."""
    buckets, start = [], 0
    for size in sizes:
        if size:
            buckets.append(indices[start : start + size])
            start += size
    buckets.reverse()
    sizes = [len(b) for b in buckets] + [0] * (len(sizes) - len(buckets))
    return sizes, [i for b in buckets for i in b]


def _is_bucket_agreement(kind, inputs):
    """For ``fail_collective``: the allgather that tells the ranks whether all initialized their buckets."""
    return (
        kind == "allgather" and inputs[0].numel() == 1 and inputs[0].dtype == torch.long
    )


@dataclasses.dataclass(frozen=True)
class _Change:
    """One change of a plan: which ranks train next, and what happens to them.

    ``reinit`` tears the default group down and sets it up again with
    ``members`` in that order, which renumbers them; otherwise ``members`` get
    a new group of the current default group.
    """

    reinit: bool
    members: Tuple[int, ...]
    use_fc2: bool
    error_in_backward: bool


@dataclasses.dataclass(frozen=True)
class _Plan:
    find_unused_parameters: bool
    changes: Tuple[_Change, ...]


@st.composite
def _plans(draw, world_size=4, max_changes=4):
    find_unused_parameters = draw(st.booleans())
    world: List[int] = list(range(world_size))
    changes = []
    for _ in range(draw(st.integers(1, max_changes))):
        reinit = draw(st.booleans())
        if reinit:
            order = draw(st.permutations(range(world_size)))
            members = tuple(order[: draw(st.integers(1, world_size))])
            world = list(members)
        else:
            members = tuple(sorted(draw(st.sets(st.sampled_from(world), min_size=1))))
        use_fc2 = draw(st.booleans()) if find_unused_parameters else True
        changes.append(_Change(reinit, members, use_fc2, draw(st.booleans())))
    return _Plan(find_unused_parameters, tuple(changes))


@instantiate_parametrized_tests
class UpdateProcessGroupTest:
    """Cases of DistributedDataParallel._update_process_group, for every backend.

    Every case checks the gradients of each step against a reference computed
    locally: the average, over the members of the *current* group, of the
    gradients that a plain copy of the module gets on each member's batch.
    """

    backend = None

    @property
    def world_size(self):
        return 4

    @property
    def device(self):
        raise NotImplementedError

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    @classmethod
    def _run(cls, rank, test_name, file_name, parent_pipe, **kwargs):
        # After a Python communication hook or work ran, release 2.1 sometimes aborts
        # while the interpreter finalizes ("terminate called without an active
        # exception"), with or without the series: a Gloo thread lets go of their
        # Python objects then. So a rank exits without finalizing, with the exit
        # code that the harness chose.
        try:
            super()._run(rank, test_name, file_name, parent_pipe, **kwargs)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    # Helpers

    def _init_default_group(self, world_size=None, rank=None, file_name=None):
        world_size = world_size or self.world_size
        dist.init_process_group(
            self.backend,
            store=dist.FileStore(file_name or self.file_name, world_size),
            rank=self.rank if rank is None else rank,
            world_size=world_size,
        )

    def _ddp(self, module_cls=Net, **kwargs):
        torch.manual_seed(0)
        module = module_cls().to(self.device)
        device_ids = [self.device] if self.device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=device_ids, **kwargs)

    def _held_group(self):
        return _HeldGroup(dist.new_group(list(range(self.world_size))))

    def _ddp_with_several_buckets(self, **kwargs):
        """A DDP module with about one parameter per bucket, once they are rebuilt."""
        with mock.patch.object(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 100):
            return self._ddp(bucket_cap_mb=1e-4, **kwargs)

    def _groups_of_one(self):
        """Gives every rank a group of its own; returns this rank's."""
        groups = [dist.new_group([rank]) for rank in range(self.world_size)]
        return groups[self.rank]

    def _assert_identical(self, tensors, group, members):
        """Checks that every member of ``group`` holds the same ``tensors``, bit for bit."""
        flat = torch.cat([t.detach().flatten() for t in tensors])
        gathered = [torch.zeros_like(flat) for _ in members]
        dist.all_gather(gathered, flat, group=group)
        for member, other in zip(members, gathered):
            self.assertEqual(
                other, flat, atol=0, rtol=0, msg=f"rank {member} holds other values"
            )

    def _sync_params(self, ddp, src):
        """What a user does today before growing: give joining ranks the members' weights."""
        for p in ddp.module.parameters():
            dist.broadcast(p.data, src)

    def _split(self):
        """Gives each half of the ranks a group; returns this rank's half and its group.

        Both halves train at once, so a part of DDP left on the group of all
        ranks averages over all of them and gets the gradients wrong, where a
        group that only some ranks use would hang instead.
        """
        everyone = list(range(self.world_size))
        halves = [everyone[: self.world_size // 2], everyone[self.world_size // 2 :]]
        groups = [dist.new_group(half) for half in halves]
        mine = 0 if self.rank in halves[0] else 1
        return halves[mine], groups[mine]

    def _reference_grads(self, module, members, step, use_fc2):
        # Process groups cannot be copied; SyncBatchNorm layers hold theirs.
        groups = [getattr(m, "process_group", None) for m in module.modules()]
        reference = copy.deepcopy(
            module, memo={id(g): g for g in groups if g is not None}
        )
        total = [torch.zeros_like(p) for p in reference.parameters()]
        for member in members:
            reference.zero_grad(set_to_none=True)
            x = _sample(member, step, self.device).to(total[0].dtype)
            _loss(reference(x, use_fc2)).backward()
            for acc, p in zip(total, reference.parameters()):
                if p.grad is not None:
                    acc += p.grad
        return [acc / len(members) for acc in total]

    def _step(
        self,
        ddp,
        members,
        step,
        use_fc2=True,
        set_to_none=True,
        model=None,
        optimizer=None,
        tol=None,
    ):
        """Trains one step and checks every gradient against the reference.

        A parameter that no member used must have no gradient. ``model`` is
        what runs the step, ``ddp`` itself by default (or a compiled ``ddp``);
        ``tol`` is the absolute and relative tolerance, for compressing hooks.
        """
        expected = self._reference_grads(ddp.module, members, step, use_fc2)
        ddp.zero_grad(set_to_none=set_to_none)
        x = _sample(self.rank, step, self.device).to(expected[0].dtype)
        _loss((ddp if model is None else model)(x, use_fc2)).backward()
        for (name, p), want in zip(ddp.module.named_parameters(), expected):
            if not use_fc2 and name.startswith("fc2.") and set_to_none:
                self.assertIsNone(p.grad, msg=f"unused {name} got a gradient")
                continue
            got = p.grad.to_dense() if p.grad.is_sparse else p.grad
            self.assertEqual(
                got,
                want,
                atol=tol,
                rtol=tol,
                msg=f"rank {self.rank}: gradient of {name} at step {step} is not "
                f"the average over members {members}",
            )
        if optimizer is not None:
            optimizer.step()

    def _failed_step(self, ddp, step, raise_at="input", model=None):
        """Runs a backward pass that raises part way through.

        ``raise_at="input"`` raises once every parameter has its gradient, so
        every bucket's allreduce has been launched; ``"fc2"`` raises before
        fc2 and fc1 have theirs, so only buckets that hold nothing but fc3's
        parameters have been.
        """
        x = _sample(self.rank, step, self.device).requires_grad_()
        handle = None
        if raise_at == "input":
            x = _RaiseInBackward.apply(x)
        else:

            def fail(grad):
                raise SimulatedError(f"simulated failure on rank {self.rank}")

            handle = ddp.module.fc2.weight.register_hook(fail)
        try:
            with self.assertRaises(SimulatedError):
                _loss((ddp if model is None else model)(x)).backward()
        finally:
            if handle is not None:
                handle.remove()

    def _compile_counter(self):
        torch._dynamo.reset()
        return torch._dynamo.testing.CompileCounter()

    # The harness

    def test_step_checks_every_gradient_against_the_average(self):
        self._init_default_group()
        ddp = self._ddp()
        everyone = list(range(self.world_size))
        for step in range(2):
            self._step(ddp, everyone, step)
        # The reference is the average over the members: over fewer, it differs.
        with self.assertRaisesRegex(AssertionError, "is not the average over members"):
            self._step(ddp, everyone[:1], 2)

    def test_held_group_holds_an_allreduce_until_released(self):
        self._init_default_group()
        held = self._held_group()
        held.holding = True
        tensor = torch.ones(3, device=self.device)
        future = held.allreduce([tensor]).get_future()
        self.assertFalse(future.done())
        self.assertEqual(tensor, torch.ones(3))
        held.release()
        self.assertTrue(future.done())
        # A released collective writes late, as a failed pass's would.
        self.assertEqual(tensor, torch.full((3,), 1e6))

    def test_held_group_runs_fails_and_holds_as_planned(self):
        self._init_default_group()
        held = self._held_group()
        held.holding = True
        held.plan = ["run", "done", "fail"]
        ran = torch.ones(2, device=self.device)
        held.allreduce([ran]).wait()
        self.assertEqual(ran, torch.full((2,), float(self.world_size)))
        done = torch.ones(2, device=self.device)
        self.assertTrue(held.allreduce([done]).get_future().done())
        self.assertEqual(done, torch.full((2,), float(self.world_size)))
        with self.assertRaisesRegex(SimulatedError, "simulated failed collective"):
            held.allreduce([torch.ones(2, device=self.device)]).wait()
        self.assertFalse(
            held.allreduce([torch.ones(2, device=self.device)]).get_future().done()
        )
        # fail_collective fails the first collective it matches, once.
        held.fail_collective = _nth("broadcast", 2)
        held.broadcast([torch.ones(1, device=self.device)]).wait()
        with self.assertRaisesRegex(SimulatedError, "simulated failed collective"):
            held.broadcast([torch.ones(1, device=self.device)]).wait()
        held.broadcast([torch.ones(1, device=self.device)]).wait()

    def test_shrink_switch_expand(self):
        self._init_default_group()
        ddp = self._ddp()
        cnt = self._compile_counter()
        model = torch.compile(ddp, backend=cnt)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
        everyone = list(range(self.world_size))
        half = self.world_size // 2
        first, second = everyone[:half], everyone[half:]
        first_pg = dist.new_group(first)
        second_pg = dist.new_group(second)
        world_pg = dist.new_group(everyone)

        self._step(ddp, everyone, 0, model=model, optimizer=optimizer)
        frames = cnt.frame_count
        self.assertGreater(frames, 0)
        for members, pg in ((first, first_pg), (second, second_pg)):
            ddp._update_process_group(pg)
            if self.rank in members:
                self.assertIs(ddp.process_group, pg)
                for step in range(1, 4):
                    self._step(ddp, members, step, model=model, optimizer=optimizer)
        ddp._update_process_group(world_pg)
        self.assertIs(ddp.process_group, world_pg)
        self._sync_params(ddp, src=first[0])
        for step in range(4, 7):
            self._step(ddp, everyone, step, model=model, optimizer=optimizer)
        self.assertEqual(cnt.frame_count, frames, msg="changing the group recompiled")

    def test_inductor_no_recompile(self):
        self._init_default_group()
        ddp = self._ddp()
        torch._dynamo.reset()
        model = torch.compile(ddp, backend="inductor")
        everyone = list(range(self.world_size))
        first = everyone[: self.world_size // 2]
        first_pg = dist.new_group(first)
        world_pg = dist.new_group(everyone)
        self._step(ddp, everyone, 0, model=model)
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        self.assertGreater(graphs, 0)
        ddp._update_process_group(first_pg)
        if self.rank in first:
            self._step(ddp, first, 1, model=model)
        ddp._update_process_group(world_pg)
        self._step(ddp, everyone, 2, model=model)
        self.assertEqual(
            torch._dynamo.utils.counters["stats"]["unique_graphs"],
            graphs,
            msg="changing the group recompiled",
        )

    def test_gradient_as_bucket_view(self):
        self._init_default_group()
        ddp = self._ddp(gradient_as_bucket_view=True)
        everyone = list(range(self.world_size))
        first = everyone[: self.world_size // 2]
        first_pg = dist.new_group(first)
        world_pg = dist.new_group(everyone)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
        for step in range(2):
            self._step(ddp, everyone, step, optimizer=optimizer)
        ddp._update_process_group(first_pg)
        if self.rank in first:
            for step in range(2, 5):
                self._step(ddp, first, step, optimizer=optimizer)
        ddp._update_process_group(world_pg)
        self._sync_params(ddp, src=first[0])
        for step in range(5, 7):
            self._step(ddp, everyone, step, optimizer=optimizer)
            # The model fits one bucket, so every gradient is a view of it.
            storages = {p.grad.untyped_storage().data_ptr() for p in ddp.parameters()}
            self.assertEqual(
                len(storages), 1, msg="gradients are not views of the bucket"
            )

    def test_broadcast_buffers_follow_group(self):
        self._init_default_group()
        ddp = self._ddp(module_cls=NetWithBuffer, broadcast_buffers=True)
        everyone = list(range(self.world_size))
        second = everyone[self.world_size // 2 :]
        second_pg = dist.new_group(second)
        ddp._update_process_group(second_pg)
        if self.rank in second:
            # Each rank writes its own value; the forward must first replace
            # it with the value of the new group's rank 0.
            ddp.module.last_mean.fill_(float(self.rank))
            seen = []
            handle = ddp.module.register_forward_pre_hook(
                lambda module, args: seen.append(module.last_mean.clone())
            )
            ddp(_sample(self.rank, 0, self.device))
            handle.remove()
            self.assertEqual(
                seen, [torch.full((3,), float(second[0]), device=self.device)]
            )
            for step in range(1, 3):
                self._step(ddp, second, step)

    def _recover_while_collectives_in_flight(self, gradient_as_bucket_view):
        # The failed pass launched its bucket's allreduce and that of the map
        # of used parameters. They are held back, and write into their tensors
        # as the next step reduces the same memory, if it does.
        self._init_default_group()
        old, new = self._held_group(), self._held_group()
        ddp = self._ddp(
            process_group=old,
            find_unused_parameters=True,
            gradient_as_bucket_view=gradient_as_bucket_view,
        )
        everyone = list(range(self.world_size))
        self._step(ddp, everyone, 0)
        old.holding = True
        yield old
        self._failed_step(ddp, 1)
        self.assertEqual(len(old.held), 2, msg="the failed pass launched no allreduce")
        old.release_before(new)
        ddp._update_process_group(new)
        if gradient_as_bucket_view:
            # A gradient that is a view of the bucket being written is dropped.
            self.assertEqual([p.grad for p in ddp.parameters()], [None] * 6)
        self._step(ddp, everyone, 2, use_fc2=False)
        old.release()
        self._step(ddp, everyone, 3)

    @parametrize("gradient_as_bucket_view", [False, True])
    def test_recover_while_collectives_in_flight(self, gradient_as_bucket_view):
        for _ in self._recover_while_collectives_in_flight(gradient_as_bucket_view):
            pass

    def test_recover_reuses_storage_whose_collective_finished(self):
        # The failed pass launched every bucket; the first ones' collectives
        # completed, the last one's is held. Only the last one gets new storage:
        # with gradient_as_bucket_view=True, the gradients are the buckets.
        self._init_default_group()
        old, new = self._held_group(), self._held_group()
        ddp = self._ddp_with_several_buckets(
            process_group=old, gradient_as_bucket_view=True
        )
        everyone = list(range(self.world_size))
        for step in range(2):
            self._step(ddp, everyone, step)
        storage = {name: _memory(p.grad) for name, p in ddp.module.named_parameters()}
        buckets = len(ddp.reducer._get_zeros_like_grad_buckets())
        old.holding = True
        old.plan = ["done"] * (buckets - 1)
        self._failed_step(ddp, 2)
        [(held, _)] = old.held
        old.release_before(new)
        ddp._update_process_group(new)
        moved = [n for n, p in ddp.module.named_parameters() if p.grad is None]
        kept = [
            n
            for n, p in ddp.module.named_parameters()
            if p.grad is not None and _memory(p.grad) == storage[n]
        ]
        self.assertEqual(
            sorted(moved + kept),
            sorted(storage),
            msg="a bucket whose collective finished got new storage",
        )
        # On a device, a completed future does not say that its kernel wrote.
        on_cpu = self.device.type == "cpu"
        self.assertEqual(
            {storage[n] for n in moved},
            {_memory(t) for t in held} if on_cpu else set(storage.values()),
            msg="not exactly the buckets whose collectives may still run moved",
        )
        for step in range(3, 5):
            self._step(ddp, everyone, step)
        old.release()

    def test_recover_keeps_buckets_not_launched(self):
        # The failed pass raises before fc2's weight and fc1 have their
        # gradients, so it launched only the bucket of fc3's parameters. The
        # other buckets keep their storage and what is in it: the step before's
        # gradients, plus what the failed pass accumulated into fc2's bias.
        self._init_default_group()
        old, new = self._held_group(), self._held_group()
        ddp = self._ddp_with_several_buckets(
            process_group=old, gradient_as_bucket_view=True
        )
        everyone = list(range(self.world_size))
        for step in range(2):
            self._step(ddp, everyone, step)
        grads = {name: p.grad for name, p in ddp.module.named_parameters()}
        old.holding = True
        self._failed_step(ddp, 2, raise_at="fc2")
        before = {name: g.clone() for name, g in grads.items()}
        launched = {_memory(t) for tensors, _ in old.held for t in tensors}
        self.assertTrue(launched, msg="the failed pass launched no allreduce")
        old.release_before(new)
        ddp._update_process_group(new)
        kept = 0
        for name, p in ddp.module.named_parameters():
            if _memory(grads[name]) in launched:
                self.assertIsNone(p.grad, msg=f"{name}'s launched gradient was kept")
            else:
                self.assertIs(p.grad, grads[name], msg=f"{name} lost its gradient")
                self.assertEqual(
                    p.grad, before[name], atol=0, rtol=0, msg=f"{name} changed"
                )
                kept += 1
        self.assertGreater(kept, 0, msg="every bucket had been launched")
        self._step(ddp, everyone, 3)
        old.release()
        self._step(ddp, everyone, 4)

    def test_recover_with_sparse_gradient_in_flight(self):
        # A sparse bucket's collective writes into the parameter's gradient
        # itself, which the next step zeroes in place and accumulates into.
        if self.backend == "nccl":
            self.skipTest("NCCL has no sparse allreduce")
        self._init_default_group()
        old, new = self._held_group(), self._held_group()
        ddp = self._ddp(module_cls=NetWithSparseEmbedding, process_group=old)
        everyone = list(range(self.world_size))
        self._step(ddp, everyone, 0, set_to_none=False)
        old.holding = True
        self._failed_step(ddp, 1)
        self.assertTrue(
            any(t.is_sparse for tensors, _ in old.held for t in tensors),
            msg="the failed pass launched no sparse allreduce",
        )
        old.release_before(new)
        ddp._update_process_group(new)
        self.assertIsNone(
            ddp.module.emb.weight.grad, msg="the in-flight sparse gradient was kept"
        )
        self._step(ddp, everyone, 2, set_to_none=False)
        old.release()
        self._step(ddp, everyone, 3, set_to_none=False)

    @parametrize("find_unused_parameters", [False, True])
    @parametrize("raise_at", ["input", "fc2"])
    def test_recover_after_error_in_backward(self, find_unused_parameters, raise_at):
        self._init_default_group()
        ddp = self._ddp(find_unused_parameters=find_unused_parameters)
        cnt = self._compile_counter()
        model = torch.compile(ddp, backend=cnt)
        everyone = list(range(self.world_size))
        recovery_pg = dist.new_group(everyone)
        self._step(ddp, everyone, 0, model=model)
        self._failed_step(ddp, 1, raise_at=raise_at, model=model)
        frames = cnt.frame_count
        ddp._update_process_group(recovery_pg)
        for step in range(2, 5):
            self._step(ddp, everyone, step, model=model)
        self.assertEqual(cnt.frame_count, frames, msg="recovering recompiled")

    def test_recover_with_other_unused_parameters(self):
        # The failed pass used fc2, the next ones do not: nothing of the failed
        # pass's record of used parameters may survive the reset (#128092).
        self._init_default_group()
        ddp = self._ddp(find_unused_parameters=True)
        everyone = list(range(self.world_size))
        recovery_pg = dist.new_group(everyone)
        self._step(ddp, everyone, 0)
        self._failed_step(ddp, 1)
        ddp._update_process_group(recovery_pg)
        for step in range(2, 4):
            self._step(ddp, everyone, step, use_fc2=False)
        self._step(ddp, everyone, 4)

    def test_several_buckets(self):
        self._init_default_group()
        ddp = self._ddp_with_several_buckets()
        everyone = list(range(self.world_size))
        first = everyone[: self.world_size // 2]
        first_pg = dist.new_group(first)
        recovery_pg = dist.new_group(everyone)
        world_pg = dist.new_group(everyone)
        self._step(ddp, everyone, 0)
        # Buckets are rebuilt from the gradients' ready order in this step.
        self._step(ddp, everyone, 1)
        self.assertGreater(len(ddp.reducer._get_zeros_like_grad_buckets()), 2)
        ddp._update_process_group(first_pg)
        if self.rank in first:
            for step in range(2, 5):
                self._step(ddp, first, step)
        ddp._update_process_group(world_pg)
        for step in range(5, 7):
            self._step(ddp, everyone, step)
        self._failed_step(ddp, 7, raise_at="fc2")
        ddp._update_process_group(recovery_pg)
        for step in range(8, 10):
            self._step(ddp, everyone, step)

    def _recover_when_finalize_fails(self):
        # finalize_backward() waits for the first bucket, whose collective ran,
        # and raises where it waits for the second, whose collective failed;
        # the collectives of the other buckets and of the map of used
        # parameters were launched, and are held back. The ranks go on in
        # halves, without fc2: the division factor, the map and the buckets of
        # the failed pass must not outlive it, and the first bucket, which
        # finished, keeps its storage and its gradients.
        self._init_default_group()
        old = self._held_group()
        members, pg = self._split()
        half = _HeldGroup(pg)
        ddp = self._ddp_with_several_buckets(
            process_group=old, find_unused_parameters=True, gradient_as_bucket_view=True
        )
        everyone = list(range(self.world_size))
        for step in range(2):
            self._step(ddp, everyone, step)
        grads = {name: p.grad for name, p in ddp.module.named_parameters()}
        buckets = len(ddp.reducer._get_zeros_like_grad_buckets())
        self.assertGreater(buckets, 2)
        old.holding = True
        old.plan = ["run", "fail"]
        yield old
        with self.assertRaisesRegex(Exception, "simulated failed collective"):
            _loss(ddp(_sample(self.rank, 2, self.device))).backward()
        self.assertEqual(
            len(old.held), buckets - 1, msg="not every later allreduce was held"
        )
        held = {_memory(t) for tensors, _ in old.held for t in tensors}
        old.release_before(half)
        ddp._update_process_group(half)
        kept = [
            name for name, p in ddp.module.named_parameters() if p.grad is grads[name]
        ]
        self.assertTrue(kept, msg="the bucket that finished lost its gradients")
        for name in kept:
            self.assertNotIn(_memory(grads[name]), held)
        self.assertLess(len(kept), len(grads), msg="no bucket was abandoned")
        self._step(ddp, members, 3, use_fc2=False)
        old.release()
        self._step(ddp, members, 4)

    def test_recover_when_finalize_fails(self):
        for _ in self._recover_when_finalize_fails():
            pass

    def test_recover_when_the_used_map_fails(self):
        # fc2 is unused in the failed pass, so finalize_backward() waits for
        # the allreduce of the map of used parameters at fc2's bucket, which
        # comes before fc1's. That allreduce failed, while the collectives of
        # fc1's buckets, as on Gloo, have not completed: they are held back,
        # and would write into the next step's gradients.
        self._init_default_group()
        everyone = list(range(self.world_size))
        old, new = self._held_group(), self._held_group()
        ddp = self._ddp_with_several_buckets(
            process_group=old, find_unused_parameters=True
        )
        self._step(ddp, everyone, 0)
        fc1 = {id(p) for p in ddp.module.fc1.parameters()}
        buckets = ddp.reducer._get_zeros_like_grad_buckets()
        first_of_fc1 = min(
            b.index() for b in buckets if {id(p) for p in b.parameters()} & fc1
        )
        self.assertGreater(first_of_fc1, 0)
        old.holding = True
        old.plan = (
            ["run"] * first_of_fc1 + ["hold"] * (len(buckets) - first_of_fc1) + ["fail"]
        )
        with self.assertRaisesRegex(Exception, "simulated failed collective"):
            _loss(ddp(_sample(self.rank, 1, self.device), use_fc2=False)).backward()
        self.assertEqual(len(old.held), len(buckets) - first_of_fc1)
        old.release_before(new)
        ddp._update_process_group(new)
        self._step(ddp, everyone, 2)
        old.release()
        self._step(ddp, everyone, 3)

    @parametrize("static_graph", [False, True])
    def test_recover_when_a_hook_raises_after_its_collective(self, static_graph):
        # The communication hook starts its bucket's allreduce, then raises, as
        # one whose second collective fails at launch would. The bucket never
        # counted as launched, but its allreduce is held back, and writes into
        # its storage as the next step reduces the same memory. With a static
        # graph, the pass that fails is the first iteration, whose buckets
        # delay_all_reduce() launches.
        self._init_default_group()
        old, new = self._held_group(), self._held_group()
        ddp = self._ddp(process_group=old, static_graph=static_graph)
        failing = []

        def hook(state, bucket):
            # What default_hooks.allreduce_hook does, on DDP's group of the
            # moment.
            group = ddp.process_group
            future = group.allreduce([bucket.buffer().div_(group.size())]).get_future()
            if failing:
                raise SimulatedError("simulated failure in a communication hook")
            return future.then(lambda fut: fut.value()[0])

        ddp.register_comm_hook(None, hook)
        everyone = list(range(self.world_size))
        if not static_graph:
            self._step(ddp, everyone, 0)
        old.holding = True
        failing.append(True)
        with self.assertRaisesRegex(Exception, "simulated failure in a communication"):
            _loss(ddp(_sample(self.rank, 1, self.device))).backward()
        # With a static graph, delay_all_reduce() launched the allreduce of
        # the map of used parameters first.
        launched = 2 if static_graph else 1
        self.assertEqual(len(old.held), launched, msg="the hook launched nothing")
        failing.clear()
        old.release_before(new)
        ddp._update_process_group(new)
        self._step(ddp, everyone, 2)
        old.release()
        self._step(ddp, everyone, 3)

    def test_recover_when_a_buffer_hook_collective_is_held(self):
        # The buffer communication hook's allreduce, which the forward pass
        # installs for finalize_backward() to wait for, is held in the pass
        # that raised, as on a hung peer. The step after the change must not
        # wait for it: it runs in a thread, which ends while that allreduce
        # is still held, or the step waited for it.
        self._init_default_group()
        old, new = self._held_group(), self._held_group()
        ddp = self._ddp(module_cls=NetWithBuffer, process_group=old)

        def hook(state, named_buffers):
            # Sums the buffers over DDP's group of the moment.
            group = ddp.process_group
            return [group.allreduce([b]).get_future() for b in named_buffers.values()]

        ddp._register_buffer_comm_hook(None, hook)
        everyone = list(range(self.world_size))
        self._step(ddp, everyone, 0)
        old.holding = True
        self._failed_step(ddp, 1)
        ddp._update_process_group(new)
        errors = []

        def step():
            try:
                self._step(ddp, everyone, 2)
            except Exception as e:
                errors.append(e)

        thread = threading.Thread(target=step)
        thread.start()
        thread.join(timeout=60)
        waited = thread.is_alive()
        old.release()
        thread.join()
        self.assertFalse(waited, msg="the step waited for the failed pass's futures")
        if errors:
            raise errors[0]
        self._step(ddp, everyone, 3)

    def test_bad_argument_changes_nothing(self):
        self._init_default_group()
        ddp = self._ddp()
        everyone = list(range(self.world_size))
        self._step(ddp, everyone, 0)
        for bad in ("gloo", 3, None):
            with self.assertRaises(TypeError) as caught:
                ddp._update_process_group(bad)
        self.assertExpectedInline(
            str(caught.exception),
            """\
DistributedDataParallel._update_process_group() expects a torch.distributed.ProcessGroup, \
or GroupMember.NON_GROUP_MEMBER as new_group() returns it on ranks outside the group, \
but got NoneType: None""",
        )
        with self.assertRaisesRegex(RuntimeError, "needs a process group, got none"):
            ddp.reducer._update_process_group(None)
        self.assertIs(ddp.process_group, dist.group.WORLD)
        for step in range(1, 3):
            self._step(ddp, everyone, step)

    def test_a_group_that_calls_back_into_the_reducer_completes(self):
        # A Python process group may call back into the reducer from its
        # collectives: here each of them reads the logging data, which takes
        # the reducer's lock. The ranks take rank 0's buckets in reverse, so
        # the allgather that tells whether all of them did runs too, in the
        # reducer: no collective of the call may run under its lock.
        self._init_default_group()
        ddp = self._ddp_with_several_buckets()
        everyone = list(range(self.world_size))
        self._step(ddp, everyone, 0)
        new = self._edit_assignment(ddp, _reversed_buckets)
        kinds = []

        def call_back(kind, inputs):
            ddp._get_ddp_logging_data()
            kinds.append(kind)
            return False

        new.fail_collective = call_back
        ddp._update_process_group(new)
        self.assertEqual(kinds, ["broadcast", "allgather", "broadcast", "allgather"])
        # Stock rebuild_buckets() broadcasts under the lock: no call back there.
        new.fail_collective = None
        for step in range(1, 3):
            self._step(ddp, everyone, step)

    def _assert_same_message_on_every_rank(self, message, group):
        messages = [None] * group.size()
        dist.all_gather_object(messages, message, group=group)
        self.assertEqual(messages, [message] * group.size())

    @parametrize(
        "setting", ["static_graph", "find_unused_parameters", "mixed_precision"]
    )
    def test_settings_that_differ_are_refused_alike_on_every_rank(self, setting):
        # Each rank trains alone, rank 1 with another setting than the others:
        # every rank raises the same error, naming rank 1, and trains on alone.
        self._init_default_group()
        alone = self._groups_of_one()
        kwargs = {}
        if self.rank == 1 and setting != "mixed_precision":
            kwargs[setting] = True
        ddp = self._ddp(process_group=alone, **kwargs)
        self._step(ddp, [self.rank], 0)
        if self.rank == 1 and setting == "mixed_precision":
            # What the constructor records; DDP's mixed precision itself needs CUDA.
            from torch.nn.parallel.distributed import _MixedPrecision

            ddp.mixed_precision = _MixedPrecision(param_dtype=torch.float16)
        world_pg = dist.new_group(list(range(self.world_size)))
        with self.assertRaises(RuntimeError) as caught:
            ddp._update_process_group(world_pg)
        message = str(caught.exception)
        expected = {
            "static_graph": "the same static_graph on every rank of the new process "
            "group, but it is True on rank 1, and False on rank 0. Construct "
            "DistributedDataParallel with the same static_graph on every rank.",
            "find_unused_parameters": "the same find_unused_parameters on every rank "
            "of the new process group, but it is True on rank 1, and False on rank "
            "0. Construct DistributedDataParallel with the same "
            "find_unused_parameters on every rank.",
            "mixed_precision": "the same mixed precision on every rank of the new "
            "process group, but its param_dtype, reduce_dtype and buffer_dtype are "
            "torch.float16, None, None on rank 1, and None, None, None on rank 0. "
            "Construct DistributedDataParallel with the same mixed_precision on "
            "every rank.",
        }[setting]
        self.assertEqual(
            message,
            f"DistributedDataParallel._update_process_group() needs {expected} "
            "Nothing changed, on any rank of the new process group.",
        )
        self._assert_same_message_on_every_rank(message, world_pg)
        self.assertIs(ddp.process_group, alone)
        if setting != "mixed_precision":
            self._step(ddp, [self.rank], 1)

    def _assert_unchanged(self, ddp, group, buckets, members):
        """Checks that ``ddp`` is still on ``group``, with ``buckets``, and trains there."""
        self.assertIs(ddp.process_group, group)
        self.assertEqual(
            [b.buffer().numel() for b in ddp.reducer._get_zeros_like_grad_buckets()],
            buckets,
        )
        for step in range(1, 3):
            self._step(ddp, members, step)

    @parametrize("rank_1_takes", ["reversed", "not_a_partition"])
    def test_reducer_takes_a_bucket_assignment(self, rank_1_takes):
        # Every rank hands its reducer its buckets in reverse, and agrees that
        # all took them. Where rank 1's have a parameter twice instead, it
        # raises that they are no partition, every other rank that rank 1 did
        # not take them, and each keeps its buckets.
        self._init_default_group()
        ddp = self._ddp_with_several_buckets()
        everyone = list(range(self.world_size))
        self._step(ddp, everyone, 0)
        buckets = [
            b.buffer().numel() for b in ddp.reducer._get_zeros_like_grad_buckets()
        ]
        assignment = ddp.reducer._bucket_assignment()
        n = len(list(ddp.parameters()))
        sizes, indices = _reversed_buckets(
            assignment[-2 * n : -n].tolist(), assignment[-n:].tolist()
        )
        if self.rank == 1 and rank_1_takes == "not_a_partition":
            indices = indices[:-1] + indices[:1]
        assignment[-2 * n :] = torch.tensor(sizes + indices)
        pg = dist.new_group(everyone)
        if rank_1_takes == "reversed":
            ddp.reducer._update_process_group(pg, assignment, agree_on_buckets=True)
            self.assertEqual(
                [
                    b.buffer().numel()
                    for b in ddp.reducer._get_zeros_like_grad_buckets()
                ],
                buckets[::-1],
            )
            for step in range(1, 3):
                self._step(ddp, everyone, step)
            return
        with self.assertRaises(RuntimeError) as caught:
            ddp.reducer._update_process_group(pg, assignment, agree_on_buckets=True)
        if self.rank == 1:
            expected = (
                "DistributedDataParallel._update_process_group() received a bucket "
                "assignment from rank 0 of the new process group that is not a "
                f"partition of the module's {n} parameters into buckets, so rank 0 "
                "holds another model or its reducer is corrupt."
            )
        else:
            expected = (
                "DistributedDataParallel._update_process_group() could not "
                "initialize the buckets of rank 1 of the new process group to the "
                "assignment of its rank 0: see the error on that rank. The module "
                "stays on its previous process group, with its buckets."
            )
        self.assertEqual(str(caught.exception).split("\n")[0], expected)
        self._assert_unchanged(ddp, dist.group.WORLD, buckets, everyone)

    def test_group_without_backend_for_device_changes_nothing(self):
        # Like an NCCL group for a CPU module: a group whose only backend
        # serves another device type than the module's. The call's first
        # collective fails on every rank, before anything changes.
        self._init_default_group()
        ddp = self._ddp()
        everyone = list(range(self.world_size))
        other = torch.device("cuda" if self.device.type == "cpu" else "cpu")
        store = dist.PrefixStore(
            "other_device", dist.distributed_c10d._get_default_store()
        )
        # Release 2.1's ProcessGroup takes its options.
        options = dist.ProcessGroup.Options(backend="gloo")
        wrong = dist.ProcessGroup(store, self.rank, self.world_size, options)
        wrong._register_backend(
            other,
            dist.ProcessGroup.BackendType.GLOO,
            dist.ProcessGroupGloo(store, self.rank, self.world_size),
        )
        self._step(ddp, everyone, 0)
        with self.assertRaisesRegex(
            RuntimeError,
            f"No backend type associated with device type {self.device.type}",
        ):
            ddp._update_process_group(wrong)
        self.assertIs(ddp.process_group, dist.group.WORLD)
        for step in range(1, 3):
            self._step(ddp, everyone, step)

    @parametrize("differs", ["sizes", "count", "dims", "dtype"])
    def test_other_model_is_refused_on_every_rank(self, differs):
        # Each rank trains alone, and rank 1 holds another model than the
        # others. The call must fail on every rank, with the same error,
        # before any collective whose lengths differ (Gloo aborts on one).
        self._init_default_group()
        alone = self._groups_of_one()
        ddp = self._ddp(process_group=alone)
        if self.rank == 1:
            module = ddp.module
            if differs == "sizes":
                module.fc3 = nn.Linear(8, 4)
            elif differs == "count":
                module.fc3 = nn.Linear(8, 3, bias=False)
            elif differs == "dims":
                module.fc3.bias = nn.Parameter(torch.zeros(1, 3))
            else:
                module.double()
            ddp = DistributedDataParallel(module, process_group=alone)
        self._step(ddp, [self.rank], 0)
        buckets = [
            b.buffer().numel() for b in ddp.reducer._get_zeros_like_grad_buckets()
        ]
        world_pg = dist.new_group(list(range(self.world_size)))
        with self.assertRaises(RuntimeError) as caught:
            ddp._update_process_group(world_pg)
        message = str(caught.exception).split("\n")[0]
        expected = {
            "sizes": "but parameter 4 (fc3.weight) has sizes [4, 8], strides [8, 1], "
            "dtype torch.float32 on rank 1, and sizes [3, 8], strides [8, 1], dtype "
            "torch.float32 on rank 0.",
            "count": "but rank 1 has 5 parameters, and rank 0 has 6.",
            "dims": "but parameter 5 (fc3.bias) has sizes [1, 3], strides [3, 1], "
            "dtype torch.float32 on rank 1, and sizes [3], strides [1], dtype "
            "torch.float32 on rank 0.",
            "dtype": "but parameter 0 (fc1.weight) has sizes [8, 6], strides [6, 1], "
            "dtype torch.float64 on rank 1, and sizes [8, 6], strides [6, 1], dtype "
            "torch.float32 on rank 0.",
        }[differs]
        self.assertEqual(
            message,
            "DistributedDataParallel._update_process_group() needs the same model "
            f"on every rank of the new process group, {expected} Pass a module "
            "with the same parameters on every rank. Nothing changed, on any rank "
            "of the new process group.",
        )
        self._assert_same_message_on_every_rank(message, world_pg)
        self._assert_unchanged(ddp, alone, buckets, [self.rank])

    @parametrize("failing", ["broadcast", "allgather"])
    def test_failed_agreement_changes_nothing(self, failing):
        # The broadcast of rank 0's description, or the allgather of the
        # verdicts, fails on every rank, on the way to each half's group: every
        # rank trains on with all.
        self._init_default_group()
        ddp = self._ddp_with_several_buckets()
        everyone = list(range(self.world_size))
        self._step(ddp, everyone, 0)
        buckets = [
            b.buffer().numel() for b in ddp.reducer._get_zeros_like_grad_buckets()
        ]
        _, pg = self._split()
        new = _HeldGroup(pg)
        new.fail_collective = _nth(failing, 1)
        with self.assertRaisesRegex(RuntimeError, "simulated failed collective"):
            ddp._update_process_group(new)
        self._assert_unchanged(ddp, dist.group.WORLD, buckets, everyone)

    def test_collective_rounds_of_a_call(self):
        # Rank 0 broadcasts its description, and every rank's verdict is
        # gathered: see Note [Agreeing on a new process group].
        self._init_default_group()
        ddp = self._ddp()
        new = self._held_group()
        collectives = []
        new.fail_collective = lambda kind, inputs: collectives.append(kind)
        ddp._update_process_group(new)
        self.assertEqual(collectives, ["broadcast", "allgather"])
        self._step(ddp, list(range(self.world_size)), 0)

    @parametrize("rebuilt", ["other_sizes", "other_offsets"])
    def test_rank_outside_while_others_rebuilt(self, rebuilt):
        # The first half trains, and rebuilds its buckets from the order its
        # gradients came in, while the second half is outside the group with
        # the constructor's buckets. Once all are together again, they must
        # agree on the buckets: the rebuilt ones have other sizes (Net with
        # small buckets), or the same sizes with parameters at other offsets
        # (NetOutOfOrder), which nothing but wrong gradients would show.
        self._init_default_group()
        if rebuilt == "other_sizes":
            ddp = self._ddp_with_several_buckets()
        else:
            ddp = self._ddp(module_cls=NetOutOfOrder)
        everyone = list(range(self.world_size))
        first = everyone[: self.world_size // 2]
        first_pg = dist.new_group(first)
        world_pg = dist.new_group(everyone)
        ddp._update_process_group(first_pg)
        if self.rank in first:
            for step in range(3):
                self._step(ddp, first, step)
        ddp._update_process_group(world_pg)
        self._sync_params(ddp, src=first[0])
        for step in range(3, 6):
            self._step(ddp, everyone, step)

    def test_reinit_default_group_renumbered(self):
        # The default group is torn down and set up again with fewer ranks,
        # which renumbers them, and later with all of them. Rank 0 is out
        # while the others rebuild their buckets.
        self._init_default_group()
        ddp = self._ddp_with_several_buckets()
        self._step(ddp, list(range(self.world_size)), 0)
        survivors = list(range(1, self.world_size))
        dist.destroy_process_group()
        if self.rank in survivors:
            self._init_default_group(
                world_size=len(survivors),
                rank=survivors.index(self.rank),
                file_name=self.file_name + ".survivors",
            )
            ddp._update_process_group(dist.group.WORLD)
            for step in range(1, 4):
                self._step(ddp, survivors, step)
            dist.destroy_process_group()
        self._init_default_group(file_name=self.file_name + ".everyone")
        ddp._update_process_group(dist.group.WORLD)
        self._sync_params(ddp, src=survivors[0])
        for step in range(4, 7):
            self._step(ddp, list(range(self.world_size)), step)

    def test_change_keeps_bucket_storage(self):
        # Gradients that are views of the buckets stay views of the same
        # storage across a change: no bucket is allocated again, and none is
        # rebuilt after the next step.
        self._init_default_group()
        ddp = self._ddp_with_several_buckets(gradient_as_bucket_view=True)
        everyone = list(range(self.world_size))
        for step in range(2):
            self._step(ddp, everyone, step, set_to_none=False)
        self.assertGreater(len(ddp.reducer._get_zeros_like_grad_buckets()), 2)
        storage = [p.grad.data_ptr() for p in ddp.parameters()]
        members, pg = self._split()
        ddp._update_process_group(pg)
        self.assertEqual([p.grad.data_ptr() for p in ddp.parameters()], storage)
        for step in range(2, 4):
            self._step(ddp, members, step, set_to_none=False)
        self.assertEqual([p.grad.data_ptr() for p in ddp.parameters()], storage)

    @parametrize("failing", ["broadcast", "agreement"])
    def test_failed_bucket_alignment_changes_nothing(self, failing):
        # On the way to each half's group, the broadcast of rank 0's
        # assignment fails on every rank; or every rank initializes its
        # buckets to another assignment, and the allgather that would tell
        # them that all succeeded fails: each puts its own buckets back, and
        # its reducer its group, and trains on with all.
        self._init_default_group()
        ddp = self._ddp_with_several_buckets()
        everyone = list(range(self.world_size))
        self._step(ddp, everyone, 0)
        buckets = [
            b.buffer().numel() for b in ddp.reducer._get_zeros_like_grad_buckets()
        ]
        _, pg = self._split()
        if failing == "broadcast":
            new = self._edit_assignment(
                ddp, lambda sizes, indices: (sizes, indices), pg
            )
            new.fail_collective = _nth("broadcast", 2)
        else:
            new = self._edit_assignment(ddp, _reversed_buckets, pg)
            new.fail_collective = _is_bucket_agreement
        with self.assertRaisesRegex(RuntimeError, "simulated failed collective"):
            ddp._update_process_group(new)
        self._assert_unchanged(ddp, dist.group.WORLD, buckets, everyone)

    def _edit_assignment(self, ddp, edit, group=None):
        """A group on which rank 0's bucket assignment reaches the others edited.

        Every rank but 0 finds rank 0's assignment other than its own (the
        digest of it in rank 0's description changes on the way), so rank 0
        broadcasts it; ``edit(sizes, indices)`` gets the two last fields of
        what arrives, as bucket_assignment() lays them out, and returns them
        changed. The group runs on ``group``, by default a new group of every
        rank.
        """
        n = len(list(ddp.parameters()))
        new = self._held_group() if group is None else _HeldGroup(group)
        digest = list(ddp._describe_for_process_group_update()).index("buckets")

        def corrupt(received):
            row = received[0]
            sizes, indices = edit(row[-2 * n : -n].tolist(), row[-n:].tolist())
            row[-2 * n - 1] = sum(1 for size in sizes if size)
            row[-2 * n :] = torch.tensor(sizes + indices, device=row.device)

        def differ(received):
            if new.rank() != 0:
                received[0][digest] += 1
            new.edit_collective = (_nth("broadcast", 1), corrupt)

        new.edit_collective = (_nth("broadcast", 1), differ)
        return new

    def test_received_assignment_is_checked(self):
        # Rank 0's assignment reaches every rank with a parameter twice.
        self._init_default_group()
        ddp = self._ddp_with_several_buckets()
        everyone = list(range(self.world_size))
        self._step(ddp, everyone, 0)
        buckets = [
            b.buffer().numel() for b in ddp.reducer._get_zeros_like_grad_buckets()
        ]
        new = self._edit_assignment(
            ddp, lambda sizes, indices: (sizes, indices[:-1] + indices[:1])
        )
        with self.assertRaises(RuntimeError) as caught:
            ddp._update_process_group(new)
        if self.rank == 0:
            expected = (
                "DistributedDataParallel._update_process_group() could not "
                "initialize the buckets of rank 1 of the new process group to the "
                "assignment of its rank 0: see the error on that rank. The module "
                "stays on its previous process group, with its buckets."
            )
        else:
            expected = (
                "DistributedDataParallel._update_process_group() received a bucket "
                "assignment from rank 0 of the new process group that is not a "
                "partition of the module's 6 parameters into buckets, so rank 0 "
                "holds another model or its reducer is corrupt."
            )
        self.assertEqual(str(caught.exception).split("\n")[0], expected)
        self._assert_unchanged(ddp, dist.group.WORLD, buckets, everyone)

    def test_failed_bucket_initialization_changes_nothing(self):
        # Rank 0's assignment reaches rank 1 as one bucket of all parameters,
        # where a sparse gradient cannot go: rank 1's initialize_buckets()
        # raises. It reaches ranks 2 and up with the buckets in reverse, so
        # they initialize theirs again, and must put the previous ones back.
        # Every rank must raise, and each keeps its own buckets.
        if self.backend == "nccl":
            self.skipTest("NCCL has no sparse allreduce")
        self._init_default_group()
        ddp = self._ddp(module_cls=NetWithSparseEmbedding, gradient_as_bucket_view=True)
        everyone = list(range(self.world_size))
        self._step(ddp, everyone, 0)
        grads = [p.grad for p in ddp.parameters()]
        buckets = [
            b.buffer().numel() for b in ddp.reducer._get_zeros_like_grad_buckets()
        ]
        self.assertGreater(len(buckets), 1)

        def one_bucket_on_rank_1(sizes, indices):
            if self.rank == 1:
                return [len(indices)] + [0] * (len(sizes) - 1), indices
            if self.rank > 1:
                return _reversed_buckets(sizes, indices)
            return sizes, indices

        new = self._edit_assignment(ddp, one_bucket_on_rank_1)
        expected = (
            "cannot include variables that expect a sparse gradient"
            if self.rank == 1
            else "could not initialize the buckets of rank 1 of the new process "
            "group to the assignment of its rank 0"
        )
        with self.assertRaisesRegex(RuntimeError, expected):
            ddp._update_process_group(new)
        self.assertTrue(all(p.grad is g for p, g in zip(ddp.parameters(), grads)))
        self._assert_unchanged(ddp, dist.group.WORLD, buckets, everyone)

    @parametrize("caller", ["training_thread", "other_thread"])
    def test_change_between_forward_and_backward(self, caller):
        # The backward pass of a forward pass that ran before the change
        # reduces over the new group; so does an evaluation forward pass's,
        # which never comes. In the first change, the second half of the
        # ranks, which had not trained while the first half rebuilt its
        # bucket, take that bucket while their backward pass is armed.
        self._init_default_group()
        ddp = self._ddp(module_cls=NetOutOfOrder)
        everyone = list(range(self.world_size))
        members, pg = self._split()
        world_pg = dist.new_group(everyone)
        ddp._update_process_group(pg)
        if self.rank in everyone[: self.world_size // 2]:
            for step in range(2):
                self._step(ddp, members, step)

        def change(pg):
            if caller == "training_thread":
                ddp._update_process_group(pg)
            else:
                thread = threading.Thread(target=ddp._update_process_group, args=(pg,))
                thread.start()
                thread.join()
            self.assertIs(ddp.process_group, pg)

        expected = self._reference_grads(ddp.module, everyone, 2, use_fc2=True)
        ddp.zero_grad(set_to_none=True)
        out = ddp(_sample(self.rank, 2, self.device))
        change(world_pg)
        _loss(out).backward()
        for (name, p), want in zip(ddp.module.named_parameters(), expected):
            self.assertEqual(p.grad, want, msg=f"gradient of {name} after the change")
        ddp.eval()
        ddp(_sample(self.rank, 3, self.device))
        ddp.train()
        change(pg)
        for step in range(4, 6):
            self._step(ddp, members, step)

    def test_no_backward_pass_between_reset_and_change(self):
        # Where the reducer's reset and its change of group were two calls, a
        # backward pass that another thread started in between (here, right
        # after the reset) ignored every hook: each rank kept its local
        # gradients. Both run in one critical section now, and that backward
        # pass, which comes after the call, reduces over the new group.
        self._init_default_group()
        ddp = self._ddp()
        self._step(ddp, list(range(self.world_size)), 0)
        members, pg = self._split()
        expected = self._reference_grads(ddp.module, members, 1, use_fc2=True)
        ddp.zero_grad(set_to_none=True)
        pending = [ddp(_sample(self.rank, 1, self.device))]
        reducer_type = type(ddp.reducer)
        reset = reducer_type._reset_state

        def reset_then_backward(reducer):
            reset(reducer)
            _loss(pending.pop()).backward()

        with mock.patch.object(reducer_type, "_reset_state", reset_then_backward):
            ddp._update_process_group(pg)
        if pending:
            _loss(pending.pop()).backward()
        for (name, p), want in zip(ddp.module.named_parameters(), expected):
            self.assertEqual(p.grad, want, msg=f"gradient of {name} after the change")

    def test_change_between_forward_and_backward_outside_the_group(self):
        # A rank outside the new group runs the backward pass of a forward pass
        # from before the change: it must not reduce over the previous group,
        # which the others have left. The members' backward pass reduces over
        # their new group.
        self._init_default_group()
        old = self._held_group()
        old.complete_on_enqueue = True
        ddp = self._ddp(process_group=old)
        everyone = list(range(self.world_size))
        self._step(ddp, everyone, 0)
        first = everyone[: self.world_size // 2]
        first_pg = dist.new_group(first)
        members = first if self.rank in first else [self.rank]
        expected = self._reference_grads(ddp.module, members, 1, use_fc2=True)
        ddp.zero_grad(set_to_none=True)
        out = ddp(_sample(self.rank, 1, self.device))
        ddp._update_process_group(first_pg)
        old.holding = True
        _loss(out).backward()
        self.assertEqual(old.held, [], msg="reduced over the previous group")
        for (name, p), want in zip(ddp.module.named_parameters(), expected):
            self.assertEqual(p.grad, want, msg=f"gradient of {name} after the change")

    def test_static_graph_change_between_forward_and_backward(self):
        # The first iteration's backward pass, armed by its forward pass before
        # the change, records the graph and ends with the delayed allreduce,
        # over the new group.
        self._init_default_group()
        ddp = self._ddp(static_graph=True)
        members, pg = self._split()
        expected = self._reference_grads(ddp.module, members, 0, use_fc2=True)
        out = ddp(_sample(self.rank, 0, self.device))
        ddp._update_process_group(pg)
        _loss(out).backward()
        for (name, p), want in zip(ddp.module.named_parameters(), expected):
            self.assertEqual(p.grad, want, msg=f"gradient of {name} after the change")
        for step in range(1, 3):
            self._step(ddp, members, step)

    @parametrize(
        "failed",
        ["first_iteration_before_any_hook", "first_iteration", "later_iteration"],
    )
    def test_static_graph(self, failed):
        # The graph of the first iteration is recorded, and the record is used
        # from the second on: a failure in the first cuts it short, after or
        # before any parameter's hook fired.
        self._init_default_group()
        ddp = self._ddp(static_graph=True)
        cnt = self._compile_counter()
        model = torch.compile(ddp, backend=cnt)
        everyone = list(range(self.world_size))
        recovery_pg = dist.new_group(everyone)
        failed_at = 3 if failed == "later_iteration" else 0
        for step in range(failed_at):
            self._step(ddp, everyone, step, model=model)
        if failed == "first_iteration_before_any_hook":
            # Raised where the module's output gets its gradient, after the
            # backward of DDP's own node, which queues the delayed allreduce.
            def fail(grad):
                raise SimulatedError(f"simulated failure on rank {self.rank}")

            def fail_at_output(module, args, out):
                out.register_hook(fail)

            handle = ddp.module.register_forward_hook(fail_at_output)
            with self.assertRaises(SimulatedError):
                _loss(ddp(_sample(self.rank, failed_at, self.device))).backward()
            handle.remove()
        else:
            self._failed_step(ddp, failed_at, raise_at="fc2", model=model)
        ddp._update_process_group(recovery_pg)
        for step in range(failed_at + 1, failed_at + 4):
            self._step(ddp, everyone, step, model=model)
        # Dynamo compiles the first iteration of a static graph and the later
        # ones apart; both have been compiled by now.
        frames = cnt.frame_count
        members, pg = self._split()
        ddp._update_process_group(pg)
        for step in range(failed_at + 4, failed_at + 7):
            self._step(ddp, members, step, model=model)
        self.assertEqual(cnt.frame_count, frames, msg="changing the group recompiled")

    @parametrize("used_map", ["fails", "in_flight"])
    def test_static_graph_first_iteration_fails_in_finalize(self, used_map):
        # The first iteration's delayed allreduce of the map of used parameters
        # fails, and finalize_backward() raises where it waits for it, as fc2
        # is unused; the buckets' allreduces ran. Or that allreduce is held
        # back, and finalize_backward() raises at the first bucket's, which
        # failed; the map's late write would mark fc2 used in the new record.
        # The record starts over.
        self._init_default_group()
        old, new = self._held_group(), self._held_group()
        ddp = self._ddp(static_graph=True, process_group=old)
        everyone = list(range(self.world_size))
        old.holding = True
        # The map's allreduce comes first, then the buckets'.
        runs = ["run"] * len(list(ddp.parameters()))
        old.plan = ["fail"] + runs if used_map == "fails" else ["hold", "fail"] + runs
        with self.assertRaisesRegex(Exception, "simulated failed collective"):
            _loss(ddp(_sample(self.rank, 0, self.device), use_fc2=False)).backward()
        old.release_before(new)
        ddp._update_process_group(new)
        for step in range(1, 4):
            self._step(ddp, everyone, step, use_fc2=False)
        old.release()
        self._step(ddp, everyone, 4, use_fc2=False)

    def test_static_graph_grow_to_ranks_that_never_trained(self):
        # The first half trains a static graph past its first iteration, while
        # the second half, outside its group, has not trained at all. Once all
        # are together, every rank records the graph again.
        self._init_default_group()
        ddp = self._ddp(static_graph=True)
        everyone = list(range(self.world_size))
        first = everyone[: self.world_size // 2]
        first_pg = dist.new_group(first)
        world_pg = dist.new_group(everyone)
        ddp._update_process_group(first_pg)
        if self.rank in first:
            for step in range(3):
                self._step(ddp, first, step)
        ddp._update_process_group(world_pg)
        self._sync_params(ddp, src=first[0])
        for step in range(3, 6):
            self._step(ddp, everyone, step)

    def test_static_graph_armed_forward_is_refused_where_ranks_record(self):
        # The first half has trained a static graph and runs a forward pass;
        # the second half has not trained. Every rank would have to record the
        # graph again, which the first half's pending backward pass cannot:
        # every rank raises the same error, and that backward pass reduces
        # over the first half's group. Between iterations, the change goes
        # through.
        self._init_default_group()
        ddp = self._ddp(static_graph=True)
        everyone = list(range(self.world_size))
        first = everyone[: self.world_size // 2]
        first_pg = dist.new_group(first)
        world_pg = dist.new_group(everyone)
        ddp._update_process_group(first_pg)
        if self.rank in first:
            for step in range(3):
                self._step(ddp, first, step)
            expected = self._reference_grads(ddp.module, first, 3, use_fc2=True)
            ddp.zero_grad(set_to_none=True)
            out = ddp(_sample(self.rank, 3, self.device))
        with self.assertRaises(RuntimeError) as caught:
            ddp._update_process_group(world_pg)
        self.assertEqual(
            str(caught.exception),
            "DistributedDataParallel._update_process_group() needs every rank of "
            f"the new process group to record the static graph again, as rank "
            f"{first[-1] + 1} records it next, but rank 0 has run the forward pass "
            "of a later iteration, whose backward pass has not run. Run that "
            "backward pass first. Nothing changed, on any rank of the new process "
            "group.",
        )
        if self.rank in first:
            self.assertIs(ddp.process_group, first_pg)
            _loss(out).backward()
            for (name, p), want in zip(ddp.module.named_parameters(), expected):
                self.assertEqual(p.grad, want, msg=f"gradient of {name}")
        ddp._update_process_group(world_pg)
        self._sync_params(ddp, src=first[0])
        for step in range(4, 6):
            self._step(ddp, everyone, step)

    def test_reducer_removes_its_comm_hook(self):
        # A reducer takes one communication hook; once it is removed, buckets
        # are allreduced as without a hook, and another can be registered.
        self._init_default_group()
        ddp = self._ddp()
        everyone = list(range(self.world_size))
        calls = []

        def counting(name):
            def hook(state, bucket):
                calls.append(name)
                return default_hooks.allreduce_hook(state, bucket)

            return hook

        ddp.register_comm_hook(ddp.process_group, counting("first"))
        self._step(ddp, everyone, 0)
        ddp.reducer._remove_comm_hook()
        self._step(ddp, everyone, 1)
        self.assertEqual(set(calls), {"first"})
        called = len(calls)
        dist._register_comm_hook(ddp.reducer, ddp.process_group, counting("second"))
        self._step(ddp, everyone, 2)
        self.assertEqual(set(calls[called:]), {"second"})
        ddp.reducer._remove_comm_hook()
        with self.assertRaisesRegex(RuntimeError, "found no communication hook"):
            ddp.reducer._remove_comm_hook()

    @parametrize("delayed", ["some", "all"])
    def test_delayed_allreduce_is_refused(self, delayed):
        self._init_default_group()
        torch.manual_seed(0)
        module = Net().to(self.device)
        if delayed == "all":
            # Without any other parameter that needs a gradient, DDP builds no reducer.
            module.frozen = nn.Parameter(
                torch.zeros(1, device=self.device), requires_grad=False
            )
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if delayed == "some":
            # fc3's gradients come first, fc1.weight's, which fire the hook, last.
            named = [(n, p) for n, p in named if n.startswith("fc3.")]
        device_ids = [self.device] if self.device.type == "cuda" else None
        ddp = DistributedDataParallel(
            module,
            device_ids=device_ids,
            delay_all_reduce_named_params=named,
            param_to_hook_all_reduce=module.fc1.weight,
        )
        self.assertEqual(ddp._delay_all_reduce_all_params, delayed == "all")
        everyone = list(range(self.world_size))
        _, pg = self._split()
        with self.assertRaises(RuntimeError) as caught:
            ddp._update_process_group(pg)
        self.assertExpectedInline(
            str(caught.exception),
            """\
DistributedDataParallel._update_process_group() needs the reducer to allreduce every \
gradient, but on rank 0 some are allreduced with delay (delay_all_reduce_named_params): \
DDP launches that allreduce outside the reducer and never waits for it, so after a \
failed backward pass it could still be writing into their gradient buffer. Construct \
DistributedDataParallel on the new process group instead. Nothing changed, on any \
rank of the new process group.""",
        )
        self.assertIs(ddp.process_group, dist.group.WORLD)
        if delayed == "all":
            # DDP cannot run the forward pass of such a module at all: its
            # constructor returns before it sets _lazy_init_ran.
            return
        # The delayed allreduce is asynchronous, and nothing waits for it but
        # the CUDA stream; a barrier on Gloo waits for the work before it.
        for step in range(1, 3):
            expected = self._reference_grads(module, everyone, step, use_fc2=True)
            ddp.zero_grad(set_to_none=True)
            _loss(ddp(_sample(self.rank, step, self.device))).backward()
            dist.barrier()
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            for (name, p), want in zip(module.named_parameters(), expected):
                self.assertEqual(p.grad, want, msg=f"gradient of {name} at step {step}")

    @parametrize("caller", ["autograd_hook", "comm_hook"])
    def test_call_during_backward_changes_nothing(self, caller):
        self._init_default_group()
        ddp = self._ddp()
        everyone = list(range(self.world_size))
        group = ddp.process_group
        pg = dist.new_group(everyone)
        errors = []

        def try_update():
            try:
                ddp._update_process_group(pg)
            except RuntimeError as e:
                errors.append(str(e))

        if caller == "comm_hook":

            def hook(state, bucket):
                if not errors:
                    try_update()
                return default_hooks.allreduce_hook(state, bucket)

            ddp.register_comm_hook(group, hook)
            handle = None
        else:
            handle = ddp.module.fc2.weight.register_hook(lambda grad: try_update())
        self._step(ddp, everyone, 0)
        if handle is not None:
            handle.remove()
        self.assertEqual(len(errors), 1)
        self.assertEqual(
            errors[0],
            "DistributedDataParallel._update_process_group() needs to be called "
            "between iterations, but rank 0 "
            "called it during a backward pass, for example from an autograd or "
            "communication hook, where the reducer is in use. Call it between "
            "iterations, or once an exception raised in a backward pass has reached "
            "the caller. Nothing changed, on any rank of the new process group.",
        )
        self.assertIs(ddp.process_group, group)
        ddp._update_process_group(pg)
        self._step(ddp, everyone, 1)

    @parametrize("callers", ["one_rank", "every_rank"])
    def test_call_inside_no_sync_changes_nothing(self, callers):
        # Inside no_sync() on rank 1 alone, or on every rank: every rank
        # raises the same error, and trains on as before.
        self._init_default_group()
        ddp = self._ddp()
        everyone = list(range(self.world_size))
        group = ddp.process_group
        new = dist.new_group(everyone)
        self._step(ddp, everyone, 0)
        with contextlib.ExitStack() as stack:
            if callers == "every_rank" or self.rank == 1:
                stack.enter_context(ddp.no_sync())
            with self.assertRaises(RuntimeError) as caught:
                ddp._update_process_group(new)
        refusing = 1 if callers == "one_rank" else 0
        self.assertEqual(
            str(caught.exception),
            "DistributedDataParallel._update_process_group() needs to be called "
            f"outside no_sync(), but rank {refusing} called it inside: the gradients "
            "accumulated there are to be reduced over the group they were "
            "accumulated for. Call it after the iteration that leaves no_sync() has "
            "synchronized them. Nothing changed, on any rank of the new process "
            "group.",
        )
        self._assert_same_message_on_every_rank(str(caught.exception), new)
        self.assertIs(ddp.process_group, group)
        for step in range(1, 3):
            self._step(ddp, everyone, step)
        ddp._update_process_group(new)
        self._step(ddp, everyone, 3)

    @parametrize(
        "copy_with", ["deepcopy", "pickle", "averaged_model", "pickled_before"]
    )
    def test_copy_with_comm_hook_on_process_group(self, copy_with):
        # DDP's pickling drops what holds a process group.
        self._init_default_group()
        ddp = self._ddp()
        ddp.register_comm_hook(ddp.process_group, default_hooks.allreduce_hook)
        self._step(ddp, list(range(self.world_size)), 0)
        if copy_with == "deepcopy":
            copied = copy.deepcopy(ddp)
        elif copy_with == "pickle":
            copied = pickle.loads(pickle.dumps(ddp))
        elif copy_with == "averaged_model":
            copied = torch.optim.swa_utils.AveragedModel(ddp).module
        else:
            # What __getstate__ gave before it kept the hooks.
            state = ddp.__getstate__()
            del state["_comm_hooks"], state["_builtin_comm_hook_type"]
            copied = DistributedDataParallel.__new__(DistributedDataParallel)
            copied.__setstate__(state)
        self.assertEqual(copied._comm_hooks, [])
        self.assertIsNone(copied._builtin_comm_hook_type)
        for p, q in zip(ddp.parameters(), copied.parameters()):
            self.assertEqual(p, q)

    @parametrize("comm_hook_type", ["ALLREDUCE", "FP16_COMPRESS"])
    def test_builtin_comm_hook_follows_group(self, comm_hook_type):
        self._init_default_group()
        ddp = self._ddp()
        ddp._register_builtin_comm_hook(
            getattr(dist.BuiltinCommHookType, comm_hook_type)
        )
        tol = 1e-2 if comm_hook_type == "FP16_COMPRESS" else None
        self._step(ddp, list(range(self.world_size)), 0, tol=tol)
        members, pg = self._split()
        ddp._update_process_group(pg)
        for step in range(1, 4):
            self._step(ddp, members, step, tol=tol)

    @parametrize("hook", ["allreduce", "fp16_compress", "fp16_wrapper"])
    def test_python_comm_hook_on_process_group_follows_group(self, hook):
        self._init_default_group()
        ddp = self._ddp()
        fn, tol = {
            "allreduce": (default_hooks.allreduce_hook, None),
            "fp16_compress": (default_hooks.fp16_compress_hook, 1e-2),
            "fp16_wrapper": (
                default_hooks.fp16_compress_wrapper(default_hooks.allreduce_hook),
                1e-2,
            ),
        }[hook]
        ddp.register_comm_hook(ddp.process_group, fn)
        self._step(ddp, list(range(self.world_size)), 0, tol=tol)
        members, pg = self._split()
        ddp._update_process_group(pg)
        self.assertEqual(ddp._comm_hooks, [(fn, pg)])
        for step in range(1, 4):
            self._step(ddp, members, step, tol=tol)

    def test_comm_hook_on_default_group_stays_there(self):
        # A state of None is the default group, which the hook allreduces
        # over whichever group DDP is on.
        self._init_default_group()
        _, pg = self._split()
        ddp = self._ddp(process_group=pg)
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        everyone = list(range(self.world_size))
        self._step(ddp, everyone, 0)
        _, other_pg = self._split()
        ddp._update_process_group(other_pg)
        self.assertEqual(ddp._comm_hooks, [(default_hooks.allreduce_hook, None)])
        for step in range(1, 3):
            self._step(ddp, everyone, step)

    def test_comm_hook_on_default_group_cannot_leave_it(self):
        # Where the module was on the default group, a state of None was its
        # group: a hook left on it would average over every rank.
        self._init_default_group()
        ddp = self._ddp()
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        self._step(ddp, list(range(self.world_size)), 0)
        members, pg = self._split()
        with self.assertRaises(ValueError) as caught:
            ddp._update_process_group(pg)
        self.assertEqual(
            str(caught.exception),
            "DistributedDataParallel._update_process_group() cannot move the "
            "communication hook of rank 0 to the new process group: its "
            "state is None, which means the default process group, this module's "
            "process group until now, and allreduce_hook would go on communicating "
            "over it. Pass update_comm_hook_state=lambda state, group: group to "
            "register the hook with the new process group as its state. Nothing "
            "changed, on any rank of the new process group.",
        )
        self.assertIs(ddp.process_group, dist.group.WORLD)
        ddp._update_process_group(pg, update_comm_hook_state=lambda state, group: group)
        self.assertEqual(ddp._comm_hooks, [(default_hooks.allreduce_hook, pg)])
        for step in range(1, 3):
            self._step(ddp, members, step)

    def test_comm_hook_state_moved_by_the_caller(self):
        # What upstream's docstring asked callers to do: move the hook's state.
        self._init_default_group()
        ddp = self._ddp()

        class State:
            def __init__(self, process_group):
                self.process_group = process_group

        def hook(state, bucket):
            return default_hooks.allreduce_hook(state.process_group, bucket)

        state = State(ddp.process_group)
        ddp.register_comm_hook(state, hook)
        self._step(ddp, list(range(self.world_size)), 0)
        members, pg = self._split()
        state.process_group = pg
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ddp._update_process_group(pg)
        self.assertEqual(ddp._comm_hooks, [(hook, state)])
        for step in range(1, 4):
            self._step(ddp, members, step)

    def test_comm_hook_state_of_its_own_is_kept_with_a_warning(self):
        # A state that keeps its group under another name, as torchft's
        # Manager keeps _pg: kept, as earlier releases did, with a warning
        # that names what to change.
        self._init_default_group()
        ddp = self._ddp()

        class Manager:
            def __init__(self, group):
                self._pg = group

        def hook(manager, bucket):
            return default_hooks.allreduce_hook(manager._pg, bucket)

        manager = Manager(ddp.process_group)
        ddp.register_comm_hook(manager, hook)
        self._step(ddp, list(range(self.world_size)), 0)
        members, pg = self._split()
        manager._pg = pg
        with self.assertWarns(FutureWarning) as caught:
            ddp._update_process_group(pg)
        self.assertEqual(
            str(caught.warning),
            "DistributedDataParallel._update_process_group() keeps the state of the "
            "communication hook UpdateProcessGroupTest.test_comm_hook_state_of_its_"
            "own_is_kept_with_a_warning.<locals>.hook, a Manager, which is not this "
            "module's process group and does not hold the new one as "
            "`process_group`: if the hook communicates over a process group of its "
            "own, it goes on doing so. A future release will raise instead. Pass "
            "update_comm_hook_state=fn, where fn(state, new_process_group) returns "
            "the state to register the hook again with, or implement "
            "_prepare_process_group_update(new_process_group) on the state.",
        )
        self.assertEqual(ddp._comm_hooks, [(hook, manager)])
        for step in range(1, 3):
            self._step(ddp, members, step)

    def test_comm_hook_refusal_on_one_rank_is_every_rank_s(self):
        # Rank 1 cannot move its hook's state: every rank raises the same
        # error, naming it, and trains on where it was.
        self._init_default_group()
        ddp = self._ddp()
        everyone = list(range(self.world_size))
        ddp.register_comm_hook(ddp.process_group, default_hooks.allreduce_hook)
        rank = self.rank

        def update_comm_hook_state(state, new_process_group):
            if rank == 1:
                raise ValueError("the state cannot follow a new group on rank 1.")
            return new_process_group

        new = dist.new_group(everyone)
        with self.assertRaises(ValueError) as caught:
            ddp._update_process_group(
                new, update_comm_hook_state=update_comm_hook_state
            )
        message = str(caught.exception)
        self.assertEqual(
            message,
            "DistributedDataParallel._update_process_group() cannot move the "
            "communication hook of rank 1 to the new process group: the state "
            "cannot follow a new group on rank 1. Nothing changed, on any rank of "
            "the new process group.",
        )
        self._assert_same_message_on_every_rank(message, new)
        self.assertIs(ddp.process_group, dist.group.WORLD)
        self.assertEqual(
            ddp._comm_hooks, [(default_hooks.allreduce_hook, dist.group.WORLD)]
        )
        self._step(ddp, everyone, 0)

    def test_different_comm_hooks_are_refused(self):
        self._init_default_group()
        ddp = self._ddp()
        everyone = list(range(self.world_size))
        hook = (
            default_hooks.fp16_compress_hook
            if self.rank == 1
            else default_hooks.allreduce_hook
        )
        ddp.register_comm_hook(ddp.process_group, hook)
        new = dist.new_group(everyone)
        with self.assertRaises(RuntimeError) as caught:
            ddp._update_process_group(new)
        message = str(caught.exception)
        self.assertEqual(
            message,
            "DistributedDataParallel._update_process_group() needs the same "
            "communication hook on every rank of the new process group, but rank 1 "
            "registered another one than rank 0. Register the same hook on every "
            "rank. Nothing changed, on any rank of the new process group.",
        )
        self._assert_same_message_on_every_rank(message, new)
        self.assertEqual(ddp._comm_hooks, [(hook, dist.group.WORLD)])

    def test_update_comm_hook_state_without_a_hook_state_is_refused(self):
        self._init_default_group()
        ddp = self._ddp()
        ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
        members, pg = self._split()
        with self.assertRaises(ValueError) as caught:
            ddp._update_process_group(pg, update_comm_hook_state=lambda state, new: new)
        self.assertEqual(
            str(caught.exception),
            "DistributedDataParallel._update_process_group() cannot move the "
            "communication hook of rank 0 to the new process group: "
            "update_comm_hook_state was passed, but register_comm_hook() registered "
            "no hook whose state it could update (a built-in hook moves with the "
            "module's process group). Leave update_comm_hook_state out. Nothing "
            "changed, on any rank of the new process group.",
        )
        self.assertIs(ddp.process_group, dist.group.WORLD)

    def test_subclass_with_a_comm_hook_of_its_own(self):
        # A subclass may define and register its own _comm_hook, as torchft's
        # DistributedDataParallel does: nothing DDP adds may shadow it.
        class HookedDDP(DistributedDataParallel):
            def __init__(self, module, **kwargs):
                super().__init__(module, **kwargs)
                self.register_comm_hook(self.process_group, self._comm_hook)

            @staticmethod
            def _comm_hook(state, bucket):
                return default_hooks.allreduce_hook(state, bucket)

        self._init_default_group()
        torch.manual_seed(0)
        ddp = HookedDDP(Net().to(self.device))
        self.assertIs(ddp._comm_hook, HookedDDP._comm_hook)
        self._step(ddp, list(range(self.world_size)), 0)
        members, pg = self._split()
        ddp._update_process_group(pg)
        self.assertEqual(ddp._comm_hooks, [(HookedDDP._comm_hook, pg)])
        for step in range(1, 3):
            self._step(ddp, members, step)

    def test_prepare_process_group_update_moves_the_state_after_the_reducer(self):
        # The state's prepare runs before the call's collectives, and what it
        # returns once the module is on the new group, with the buckets that
        # kept their parameters: None before the buckets are rebuilt, as the
        # next iteration rebuilds them, and all of them after.
        self._init_default_group()
        ddp = self._ddp_with_several_buckets()
        new = self._held_group()
        collectives = []
        new.fail_collective = lambda kind, inputs: collectives.append(kind)
        seen = []
        test = self

        class State:
            process_group = None

            def _prepare_process_group_update(self, new_process_group):
                test.assertIs(new_process_group, new)
                seen.append(("prepare", ddp.process_group, len(collectives)))

                def commit(kept_buckets):
                    seen.append(
                        ("commit", ddp.process_group, len(collectives), kept_buckets)
                    )
                    self.process_group = new_process_group

                return commit

        def hook(state, bucket):
            return default_hooks.allreduce_hook(state.process_group, bucket)

        state = State()
        state.process_group = ddp.process_group
        ddp.register_comm_hook(state, hook)
        ddp._update_process_group(new)
        self.assertEqual(
            seen,
            [("prepare", dist.group.WORLD, 0), ("commit", new, 2, None)],
        )
        self.assertEqual(ddp._comm_hooks, [(hook, state)])
        # The second iteration's forward pass rebuilds the buckets.
        everyone = list(range(self.world_size))
        for step in range(2):
            self._step(ddp, everyone, step)
        buckets = len(ddp.reducer._get_zeros_like_grad_buckets())
        self.assertGreater(buckets, 1)
        seen.clear()
        collectives.clear()
        ddp._update_process_group(new)
        self.assertEqual(seen[1][3], frozenset(range(buckets)))
        self._step(ddp, everyone, 2)

    def test_buckets_kept_are_those_whose_parameters_stayed(self):
        # What DDP hands the commits of stateful hooks: the buckets of the new
        # assignment that hold the parameters they held, or None where the
        # next iteration rebuilds the buckets.
        buckets_kept = torch.nn.parallel.distributed._buckets_kept
        self._init_default_group()
        ddp = self._ddp_with_several_buckets()
        for step in range(2):  # the second rebuilds the buckets
            self._step(ddp, list(range(self.world_size)), step)
        old = ddp.reducer._bucket_assignment()
        buckets = int(old[1])
        self.assertGreater(buckets, 2, msg="the buckets were not rebuilt")
        self.assertEqual(buckets_kept(old, old), frozenset(range(buckets)))
        n = len(list(ddp.parameters()))
        sizes, indices = _reversed_buckets(old[-2 * n : -n].tolist(), old[-n:].tolist())
        reversed_buckets = old.clone()
        reversed_buckets[-2 * n :] = torch.tensor(sizes + indices)
        # Reversed, only a middle bucket holds what it held.
        middle = {buckets // 2} if buckets % 2 else set()
        self.assertEqual(buckets_kept(old, reversed_buckets), frozenset(middle))
        not_rebuilt = old.clone()
        not_rebuilt[0] = 0
        self.assertIsNone(buckets_kept(old, not_rebuilt))

    def test_prepare_process_group_update_refusal_on_one_rank_is_every_rank_s(self):
        # Rank 1's hook refuses to move: every rank raises the same error,
        # naming it, and trains on where it was.
        self._init_default_group()
        ddp = self._ddp()
        everyone = list(range(self.world_size))
        rank = self.rank

        class State:
            def __init__(self, group):
                self.process_group = group

            def _prepare_process_group_update(self, new_process_group):
                if rank == 1:
                    raise ValueError("State cannot follow a new group on rank 1.")
                return lambda: setattr(self, "process_group", new_process_group)

        def hook(state, bucket):
            return default_hooks.allreduce_hook(state.process_group, bucket)

        state = State(ddp.process_group)
        ddp.register_comm_hook(state, hook)
        new = dist.new_group(everyone)
        with self.assertRaises(ValueError) as caught:
            ddp._update_process_group(new)
        message = str(caught.exception)
        self.assertEqual(
            message,
            "DistributedDataParallel._update_process_group() cannot move the "
            "communication hook of rank 1 to the new process group: State cannot "
            "follow a new group on rank 1. Nothing changed, on any rank of the new "
            "process group.",
        )
        self._assert_same_message_on_every_rank(message, new)
        self.assertIs(ddp.process_group, dist.group.WORLD)
        self.assertIs(state.process_group, dist.group.WORLD)
        self._step(ddp, everyone, 0)

    def test_buffer_comm_hook_follows_group(self):
        self._init_default_group()
        ddp = self._ddp(module_cls=NetWithBuffer)
        ddp._register_buffer_comm_hook(ddp.process_group, lambda state, buffers: [])
        _, pg = self._split()
        ddp._update_process_group(pg)
        self.assertIs(ddp.buffer_hook.buffer_comm_hook_state, pg)

    def test_buffer_comm_hook_of_another_group_stays(self):
        self._init_default_group()
        ddp = self._ddp(module_cls=NetWithBuffer)
        own = dist.new_group(list(range(self.world_size)))
        ddp._register_buffer_comm_hook(own, lambda state, buffers: [])
        _, pg = self._split()
        ddp._update_process_group(pg)
        self.assertIs(ddp.buffer_hook.buffer_comm_hook_state, own)

    def test_ddp_stateful_hooks_are_rearmed(self):
        # DDP's mixed precision and optimizer-in-backward hooks need an
        # accelerator to run; their states are set here as a backward pass
        # that raised leaves them: waiting for a callback that autograd dropped.
        from torch.distributed.algorithms.ddp_comm_hooks import (
            mixed_precision_hooks,
            optimizer_overlap_hooks,
        )

        self._init_default_group()
        ddp = self._ddp()
        _, pg = self._split()
        upcast_state = mixed_precision_hooks._AllreduceUpcastHookState(
            ddp_weakref=weakref.ref(ddp),
            upcast_stream=None,
            wait_for_stream_enqueued=True,
        )
        ddp.register_comm_hook(
            upcast_state, mixed_precision_hooks._reducer_allreduce_and_upcast_hook
        )
        ddp._update_process_group(pg)
        self.assertFalse(upcast_state.wait_for_stream_enqueued)
        self.assertEqual(
            ddp._comm_hooks,
            [(mixed_precision_hooks._reducer_allreduce_and_upcast_hook, upcast_state)],
        )

        ddp = self._ddp(process_group=pg)
        # As DDP registers it for optimizers applied in backward.
        with mock.patch.object(optimizer_overlap_hooks.torch.cuda, "Stream"):
            hook = optimizer_overlap_hooks._apply_optim_in_backward_hook(
                gradient_is_bucket_view=False
            )
        optim_state = hook.keywords["optim_stream_state"]
        optim_state.wait_for_optim_stream_enqueued = True
        ddp.register_comm_hook(weakref.ref(ddp), hook)
        ddp._update_process_group(dist.new_group(list(range(self.world_size))))
        self.assertFalse(optim_state.wait_for_optim_stream_enqueued)

    def _ddp_with_zero_hook(self, wrapped, hook_name):
        """A DDP module with ``wrapped`` under the ZeRO hook ``hook_name``; returns both.

        The hook is for NCCL only; it is never run here.
        """
        from torch.distributed.algorithms.ddp_comm_hooks import ddp_zero_hook
        from torch.distributed.optim import ZeroRedundancyOptimizer

        self._init_default_group()
        ddp = self._ddp()
        zero = ZeroRedundancyOptimizer(
            ddp.parameters(),
            optimizer_class=torch.optim.SGD,
            overlap_with_ddp=True,
            lr=0.05,
        )
        with mock.patch.object(
            ddp_zero_hook.dist, "get_backend", return_value=dist.Backend.NCCL
        ):
            hook = getattr(ddp_zero_hook, hook_name)(wrapped, ddp, zero)
            return ddp, hook

    @parametrize(
        "hook_name", ["hook_with_zero_step", "hook_with_zero_step_interleaved"]
    )
    def test_zero_hook_is_refused(self, hook_name):
        ddp, hook = self._ddp_with_zero_hook(default_hooks.allreduce_hook, hook_name)
        ddp.register_comm_hook(ddp.process_group, hook)
        _, pg = self._split()
        with self.assertRaises(ValueError) as caught:
            ddp._update_process_group(pg)
        message = str(caught.exception)
        self.assertEqual(
            message,
            "DistributedDataParallel._update_process_group() cannot move the "
            "communication hook of rank 0 to the new process group: "
            f"{hook_name} cannot follow "
            "DistributedDataParallel._update_process_group(): its "
            "ZeroRedundancyOptimizer keeps its own process group and its partition "
            "of the parameters across that group's ranks. Construct "
            "DistributedDataParallel and ZeroRedundancyOptimizer on the new process "
            "group instead. Nothing changed, on any rank of the new process group.",
        )
        self._assert_same_message_on_every_rank(message, pg)
        self.assertIs(ddp.process_group, dist.group.WORLD)

    def test_logging_data_follows_group(self):
        self._init_default_group()
        ddp = self._ddp_with_several_buckets()
        for step in range(2):
            self._step(ddp, list(range(self.world_size)), step)
        members, pg = self._split()
        with mock.patch.dict(os.environ, {"GLOO_DEVICE_TRANSPORT": "TCP"}):
            ddp._update_process_group(pg)
        data = ddp._get_ddp_logging_data()
        buckets = ddp.reducer._get_zeros_like_grad_buckets()
        self.assertGreater(len(buckets), 1)
        self.assertEqual(
            (
                data["world_size"],
                data["rank"],
                data["backend_name"],
                data["bucket_sizes"],
            ),
            (
                len(members),
                members.index(self.rank),
                self.backend,
                ", ".join(
                    str(b.buffer().numel() * b.buffer().element_size()) for b in buckets
                ),
            ),
        )
        if self.backend == "gloo":
            self.assertEqual(data["gloo_device_transport"], "TCP")
        self._step(ddp, members, 2)

    def test_sync_batch_norm_follows_group(self):
        self._init_default_group()
        own_pg = dist.new_group(list(range(self.world_size)))
        if self.device.type == "cpu":
            # DDP refuses SyncBatchNorm on CPU, where it cannot synchronize in
            # training; in eval mode it does not, which this case does on CPU.
            with mock.patch.object(
                DistributedDataParallel, "_passing_sync_batchnorm_handle"
            ):
                ddp = self._ddp(module_cls=NetWithSyncBatchNorm)
            ddp.eval()
        else:
            ddp = self._ddp(module_cls=NetWithSyncBatchNorm)
        ddp.module.bn.process_group = ddp.process_group
        ddp.module.own_bn.process_group = own_pg
        members, pg = self._split()
        ddp._update_process_group(pg)
        self.assertIs(ddp.module.bn.process_group, pg)
        self.assertIsNone(
            ddp.module.default_bn.process_group,
            msg="a layer on the default group moved",
        )
        self.assertIs(
            ddp.module.own_bn.process_group,
            own_pg,
            msg="a layer on its own group moved",
        )
        if self.device.type == "cuda":
            # In training, the batch statistics are those of the members' batches.
            with torch.no_grad():
                batches = [
                    F.relu(ddp.module.fc1(_sample(m, 1, self.device))) for m in members
                ]
                expected = 0.1 * torch.cat(batches).mean(0)
            ddp(_sample(self.rank, 1, self.device))
            self.assertEqual(ddp.module.bn.running_mean, expected)
        else:
            for step in range(1, 3):
                self._step(ddp, members, step)

    def test_rank_outside_group_is_parked(self):
        self._init_default_group()
        ddp = self._ddp()
        cnt = self._compile_counter()
        model = torch.compile(ddp, backend=cnt)
        everyone = list(range(self.world_size))
        first = everyone[: self.world_size // 2]
        first_pg = dist.new_group(first)
        world_pg = dist.new_group(everyone)
        self._step(ddp, everyone, 0, model=model)
        frames = cnt.frame_count
        ddp._update_process_group(first_pg)
        if self.rank in first:
            for step in range(1, 3):
                self._step(ddp, first, step, model=model)
        else:
            with self.assertRaises(RuntimeError) as caught:
                model(_sample(self.rank, 1, self.device))
            self.assertExpectedInline(
                str(caught.exception),
                """\
DistributedDataParallel cannot run a forward pass on this rank: it is not a member of \
the process group last passed to _update_process_group(). Pass a process group that \
contains this rank first.""",
            )
        ddp._update_process_group(world_pg)
        self._sync_params(ddp, src=first[0])
        for step in range(3, 5):
            self._step(ddp, everyone, step, model=model)
        self.assertEqual(cnt.frame_count, frames, msg="parking recompiled")

    def test_failed_rejoin_keeps_the_rank_parked(self):
        # A rank outside the group rejoins, and the call's allgather of the
        # verdicts fails on every rank: the rank stays parked.
        self._init_default_group()
        ddp = self._ddp()
        everyone = list(range(self.world_size))
        first = everyone[: self.world_size // 2]
        first_pg = dist.new_group(first)
        ddp._update_process_group(first_pg)
        new = self._held_group()
        new.fail_collective = _nth("allgather", 1)
        with self.assertRaisesRegex(RuntimeError, "simulated failed collective"):
            ddp._update_process_group(new)
        if self.rank in first:
            self.assertIs(ddp.process_group, first_pg)
            self._step(ddp, first, 0)
        else:
            with self.assertRaisesRegex(
                RuntimeError, "not a member of the process group"
            ):
                ddp(_sample(self.rank, 0, self.device))

    def test_sync_module_states_for_joining_ranks(self):
        self._init_default_group()
        ddp = self._ddp(module_cls=NetWithBuffer)
        everyone = list(range(self.world_size))
        first = everyone[: self.world_size // 2]
        first_pg = dist.new_group(first)
        world_pg = dist.new_group(everyone)
        optimizer = torch.optim.Adam(ddp.parameters(), lr=0.05)
        ddp._update_process_group(first_pg)
        if self.rank in first:
            for step in range(3):
                self._step(ddp, first, step, optimizer=optimizer)
        else:
            # A process that arrives now: fresh weights, buffers and optimizer.
            torch.manual_seed(100 + self.rank)
            ddp.module.load_state_dict(NetWithBuffer().to(self.device).state_dict())
            ddp.module.last_mean.fill_(float(self.rank))
            optimizer = torch.optim.Adam(ddp.parameters(), lr=0.05)
        ddp._update_process_group(world_pg, sync_module_states=True, src=first[0])
        self._assert_identical(ddp.module.state_dict().values(), world_pg, everyone)
        # The optimizer's state is the caller's to bring over.
        state = [optimizer.state_dict()]
        dist.broadcast_object_list(state, src=first[0], group=world_pg)
        optimizer.load_state_dict(state[0])
        for step in range(3, 6):
            self._step(ddp, everyone, step, optimizer=optimizer)
            self._assert_identical(ddp.parameters(), world_pg, everyone)

    def test_failed_sync_module_states_can_be_repeated(self):
        self._init_default_group()
        ddp = self._ddp()
        everyone = list(range(self.world_size))
        world_pg = dist.new_group(everyone)
        torch.manual_seed(self.rank)
        for p in ddp.module.parameters():
            p.data.normal_()
        with mock.patch(
            "torch.nn.parallel.distributed._sync_module_states",
            side_effect=RuntimeError("a rank of the new group failed"),
        ):
            with self.assertRaisesRegex(RuntimeError, "a rank of the new group failed"):
                ddp._update_process_group(world_pg, sync_module_states=True)
        self.assertIs(ddp.process_group, world_pg)
        ddp._update_process_group(world_pg, sync_module_states=True)
        self._assert_identical(ddp.parameters(), world_pg, everyone)
        for step in range(2):
            self._step(ddp, everyone, step)

    @parametrize("differs", ["sync_module_states", "src", "src_outside_the_group"])
    def test_sync_module_states_that_differ_are_refused_alike(self, differs):
        # Rank 1 alone passes other arguments: every rank raises the same
        # error, naming it, before any broadcast, and trains on as before.
        self._init_default_group()
        ddp = self._ddp()
        everyone = list(range(self.world_size))
        new = dist.new_group(everyone)
        kwargs = {"sync_module_states": True, "src": 0}
        if self.rank == 1:
            kwargs = {
                "sync_module_states": {"sync_module_states": False},
                "src": {"sync_module_states": True, "src": 2},
                "src_outside_the_group": {
                    "sync_module_states": True,
                    "src": self.world_size,
                },
            }[differs]
        with self.assertRaises(RuntimeError) as caught:
            ddp._update_process_group(new, **kwargs)
        message = str(caught.exception)
        expected = {
            "sync_module_states": "the same sync_module_states on every rank of the "
            "new process group, but it is False on rank 1, and True on rank 0. Pass "
            "the same sync_module_states on every rank.",
            "src": "the same src, a rank of the new process group, on every rank of "
            "it, but rank 1 passed src=2, and rank 0 src=0. Pass the same rank of "
            "the new process group as src on every rank.",
            "src_outside_the_group": "the same src, a rank of the new process group, "
            "on every rank of it, but rank 1 passed src=4, and rank 0 src=0. Pass "
            "the same rank of the new process group as src on every rank.",
        }[differs]
        self.assertEqual(
            message,
            f"DistributedDataParallel._update_process_group() needs {expected} "
            "Nothing changed, on any rank of the new process group.",
        )
        self._assert_same_message_on_every_rank(message, new)
        self.assertIs(ddp.process_group, dist.group.WORLD)
        self._step(ddp, everyone, 0)

    def test_src_outside_the_group_is_refused(self):
        self._init_default_group()
        ddp = self._ddp()
        members, pg = self._split()
        with self.assertRaises(RuntimeError) as caught:
            ddp._update_process_group(pg, sync_module_states=True, src=len(members))
        self.assertEqual(
            str(caught.exception),
            "DistributedDataParallel._update_process_group() needs the same src, a "
            "rank of the new process group, on every rank of it, but rank 0 passed "
            "src=2, which the group does not have. Pass the same rank of the new "
            "process group as src on every rank. Nothing changed, on any rank of the "
            "new process group.",
        )
        self.assertIs(ddp.process_group, dist.group.WORLD)

    def test_join_uneven_inputs_after_change(self):
        self._init_default_group()
        ddp = self._ddp()
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
        self._step(ddp, list(range(self.world_size)), 0, optimizer=optimizer)
        members, pg = self._split()
        ddp._update_process_group(pg)
        # The first member has one batch more than the others, who join early.
        last_step = 3 if self.rank == members[0] else 2
        with ddp.join():
            for step in range(1, last_step + 1):
                active = members if step < 3 else members[:1]
                # Joined ranks contribute zeros; the sum is divided by the
                # number of members, the group's size.
                expected = [
                    g * len(active) / len(members)
                    for g in self._reference_grads(
                        ddp.module, active, step, use_fc2=True
                    )
                ]
                optimizer.zero_grad(set_to_none=True)
                _loss(ddp(_sample(self.rank, step, self.device))).backward()
                for (name, p), want in zip(ddp.module.named_parameters(), expected):
                    self.assertEqual(
                        p.grad, want, msg=f"gradient of {name} at step {step}"
                    )
                optimizer.step()
        self._step(ddp, members, 4)

    def test_call_inside_join_changes_nothing(self):
        # The context keeps the group it was entered with. A context that
        # raised has ended too, although the caller still holds it.
        self._init_default_group()
        ddp = self._ddp()
        everyone = list(range(self.world_size))
        group = ddp.process_group
        members, pg = self._split()
        context = ddp.join()
        with context:
            self._step(ddp, everyone, 0)
            with self.assertRaises(RuntimeError) as caught:
                ddp._update_process_group(pg)
            self._step(ddp, everyone, 1)
        self.assertEqual(
            str(caught.exception),
            "DistributedDataParallel._update_process_group() cannot be called inside "
            "a Join context of this module (join(), or "
            "torch.distributed.algorithms.Join): the context runs the collectives "
            "that shadow those of the ranks that have joined on the process group it "
            "was entered with. Call it before the context, or once it has exited.",
        )
        self.assertIs(ddp.process_group, group)
        context = ddp.join()
        with self.assertRaises(SimulatedError):
            with context:
                raise SimulatedError(f"simulated failure on rank {self.rank}")
        ddp._update_process_group(pg)
        self._step(ddp, members, 2)

    def test_joined_rank_waits_for_its_timeout_where_the_others_refuse(self):
        # Rank 0 runs out of inputs and joins; the others then call
        # _update_process_group() inside the context, which raises there and
        # leaves the context. Join's protocol has no message for that: rank 0
        # waits in the collective that shadows their next forward pass until
        # the group's timeout, as it does wherever a rank raises inside the
        # context. The others wait for it through the store, so that their
        # exit does not close its connections first.
        self._init_default_group()
        store = dist.distributed_c10d._get_default_store()
        group = dist.new_group(
            list(range(self.world_size)), timeout=timedelta(seconds=2)
        )
        ddp = self._ddp(process_group=group)
        members, pg = self._split()
        with self.assertRaises(RuntimeError) as caught:
            with ddp.join():
                self._step(ddp, list(range(self.world_size)), 0)
                if self.rank != 0:
                    ddp._update_process_group(pg)
        if self.rank == 0:
            self.assertIn("Timed out", str(caught.exception))
            store.set("joined rank timed out", "1")
        else:
            self.assertIn("inside a Join context", str(caught.exception))
            store.wait(["joined rank timed out"])

    def _ddp_with_power_sgd(self, held=False):
        """A DDP module whose PowerSGD hook compresses from its third step on.

        With ``held``, the hook communicates on a :class:`_HeldGroup`.
        """
        self._init_default_group()
        ddp = self._ddp()
        state = powerSGD_hook.PowerSGDState(
            process_group=self._held_group() if held else ddp.process_group,
            start_powerSGD_iter=2,
            min_compression_rate=0.1,
        )
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return ddp, state

    def _compressed_step(self, ddp, step):
        ddp.zero_grad(set_to_none=True)
        _loss(ddp(_sample(self.rank, step, self.device))).backward()

    def _assert_same_grads(self, ddp, group):
        grads = torch.cat([p.grad.flatten() for p in ddp.parameters()])
        gathered = [torch.zeros_like(grads) for _ in range(group.size())]
        dist.all_gather(gathered, grads, group=group)
        for other in gathered:
            self.assertEqual(
                other, grads, msg="members got different compressed gradients"
            )

    @parametrize("joins", [False, True])
    def test_power_sgd_state_follows_group(self, joins):
        # The buckets keep their parameters: each rank keeps its error
        # feedback, and the warm-start memories stay where every member holds
        # them. A rank that joins holds none, so then nobody keeps those.
        ddp, state = self._ddp_with_power_sgd()
        everyone = list(range(self.world_size))
        for step in range(2):
            self._step(ddp, everyone, step)
        for step in range(2, 4):
            self._compressed_step(ddp, step)
        self.assertTrue(state.error_dict, msg="PowerSGD never compressed")
        members, pg = self._split()
        joining = joins and self.rank == members[-1]
        if joining:
            # As a rank that joins holds it: no memories, a new rng, iter 0.
            state.__init__(
                process_group=ddp.process_group,
                start_powerSGD_iter=2,
                min_compression_rate=0.1,
            )
        else:
            # The ranks that stay may have drawn from their rng differently.
            state.rng.randint(1_000_000_000, size=self.rank + 1)
        errors = dict(state.error_dict)
        memories = dict(state.q_memory_dict)
        ddp._update_process_group(pg)
        self.assertEqual(ddp._comm_hooks, [(powerSGD_hook.powerSGD_hook, state)])
        self.assertIs(state.process_group, pg)
        self.assertEqual(state.iter, 4, msg="the ranks did not agree on iter")
        self.assertEqual(state.error_dict.keys(), errors.keys())
        for i, error in state.error_dict.items():
            self.assertIs(error, errors[i])
        self.assertEqual(state.q_memory_dict, {} if joins else memories)
        draws = [None] * pg.size()
        dist.all_gather_object(
            draws, copy.deepcopy(state.rng).randint(1_000_000_000), group=pg
        )
        self.assertEqual(len(set(draws)), 1, msg=f"the ranks' rngs differ: {draws}")
        for step in range(4, 7):
            self._compressed_step(ddp, step)
            self._assert_same_grads(ddp, pg)
        self.assertEqual(state.iter, 7)
        # A checkpoint holds the slots that stock's holds, which a state of
        # stock can load: the count of changes means nothing in another
        # process, and starts at 0 there.
        self.assertEqual(
            sorted(state.__getstate__()),
            [
                "batch_tensors_with_same_shape",
                "compression_stats_logging_frequency",
                "error_dict",
                "iter",
                "matrix_approximation_rank",
                "min_compression_rate",
                "next_stats_report",
                "orthogonalization_epsilon",
                "p_memory_dict",
                "q_memory_dict",
                "rng",
                "start_powerSGD_iter",
                "total_numel_after_compression",
                "total_numel_before_compression",
                "use_error_feedback",
                "warm_start",
            ],
        )
        self.assertEqual(pickle.loads(pickle.dumps(state))._process_group_updates, 0)

    def test_power_sgd_state_where_the_buckets_are_rebuilt(self):
        # Every rank moves before its first iteration, so the next one
        # rebuilds the buckets: nothing is kept, and that iteration allreduces
        # without compression, whatever iter the ranks agree on.
        ddp, state = self._ddp_with_power_sgd()
        if self.rank == 1:
            state.iter = 5
        members, pg = self._split()
        ddp._update_process_group(pg)
        self.assertEqual(state.iter, 1 if self.rank in (0, 1) else 0)
        self._step(ddp, members, 0)
        for step in range(1, 3):
            self._compressed_step(ddp, step)
            self._assert_same_grads(ddp, pg)

    def test_power_sgd_keeps_what_every_rank_kept(self):
        # DDP hands the state the buckets that kept their parameters, which
        # differ among ranks that come from groups whose buckets differed.
        # Each rank keeps its error feedback of the buckets it kept, and every
        # rank the warm-start memories of the buckets that all kept and hold
        # them for.
        ddp, state = self._ddp_with_power_sgd()
        # As after compressed iterations over three buckets, of which the
        # last two compress.
        state.error_dict = {i: torch.full((4,), float(i)) for i in range(3)}
        state.p_memory_dict = {i: torch.ones(2, 1) for i in (1, 2)}
        state.q_memory_dict = {i: torch.ones(2, 1) for i in (1, 2)}
        errors = dict(state.error_dict)
        kept = frozenset(range(3)) if self.rank == 0 else frozenset({2})
        state._prepare_process_group_update(ddp.process_group)(kept)
        self.assertEqual(state.error_dict.keys(), kept)
        for i, error in state.error_dict.items():
            self.assertIs(error, errors[i])
        self.assertEqual(sorted(state.p_memory_dict), [2])
        self.assertEqual(sorted(state.q_memory_dict), [2])

    def test_power_sgd_callback_from_before_the_change_writes_nothing(self):
        # A compressing backward pass raises once every bucket's hook has
        # launched its first allreduce, which the hook's group holds. The
        # change comes, and then those allreduces land: their callbacks stop
        # before they issue a collective, write a memory or count an
        # iteration.
        ddp, state = self._ddp_with_power_sgd(held=True)
        held = state.process_group
        everyone = list(range(self.world_size))
        for step in range(2):
            self._step(ddp, everyone, step)
        for step in range(2, 4):
            self._compressed_step(ddp, step)
        held.holding = True
        self._failed_step(ddp, 4)
        self.assertTrue(held.held, msg="no collective of the failed pass was held")
        new = dist.new_group(everyone)
        ddp._update_process_group(new)
        after = (
            state.iter,
            {i: e.clone() for i, e in state.error_dict.items()},
            {i: q.clone() for i, q in state.q_memory_dict.items()},
        )
        held.release()
        self.assertEqual(
            (
                state.iter,
                {i: e.clone() for i, e in state.error_dict.items()},
                {i: q.clone() for i, q in state.q_memory_dict.items()},
            ),
            after,
        )
        self.assertIs(state.process_group, new)
        for step in range(5, 7):
            self._compressed_step(ddp, step)
            self._assert_same_grads(ddp, new)

    def test_post_local_sgd_state_follows_group(self):
        self._init_default_group()
        ddp = self._ddp()
        state = post_localSGD_hook.PostLocalSGDState(
            process_group=None, subgroup=None, start_localSGD_iter=100
        )
        ddp.register_comm_hook(state, post_localSGD_hook.post_localSGD_hook)
        for step in range(2):
            self._step(ddp, list(range(self.world_size)), step)
        members, pg = self._split()
        if self.rank == members[-1]:
            # As a rank that joins counts: from 0.
            state.iter = 0
        ddp._update_process_group(pg)
        self.assertIs(state.process_group, pg)
        self.assertEqual(state.iter, 2, msg="the ranks did not agree on iter")
        for step in range(2, 5):
            self._step(ddp, members, step)

    def test_post_local_sgd_subgroup_needs_new_state(self):
        self._init_default_group()
        ddp = self._ddp()
        everyone = list(range(self.world_size))
        old_subgroup = dist.new_group(everyone)
        state = post_localSGD_hook.PostLocalSGDState(
            process_group=None, subgroup=old_subgroup, start_localSGD_iter=100
        )
        ddp.register_comm_hook(state, post_localSGD_hook.post_localSGD_hook)
        self._step(ddp, everyone, 0)
        members, pg = self._split()
        with self.assertRaises(ValueError) as caught:
            ddp._update_process_group(pg)
        self.assertEqual(
            str(caught.exception),
            "DistributedDataParallel._update_process_group() cannot move the "
            "communication hook of rank 0 to the new process group: "
            "PostLocalSGDState cannot follow "
            "DistributedDataParallel._update_process_group(): its subgroup is made "
            "of the ranks of another group, the old process group's or, where "
            "post_localSGD_hook created it, the default group's. Pass "
            "update_comm_hook_state=fn to _update_process_group(), where "
            "fn(state, new_process_group) returns a PostLocalSGDState whose "
            "subgroup is made of the new group's ranks. Nothing changed, on any "
            "rank of the new process group.",
        )
        self.assertIs(ddp.process_group, dist.group.WORLD)
        self.assertIsNone(state.process_group)
        self._step(ddp, everyone, 1)

        def new_state(old, group):
            return post_localSGD_hook.PostLocalSGDState(
                process_group=group, subgroup=group, start_localSGD_iter=100
            )

        ddp._update_process_group(pg, update_comm_hook_state=new_state)
        for step in range(2, 4):
            self._step(ddp, members, step)


@instantiate_parametrized_tests
class UpdateProcessGroupCudaTest:
    """Cases that only CUDA parameters can run, added to the shared ones.

    They run on one GPU: the Gloo-on-CUDA class puts every rank on the same
    device, and the NCCL groups here hold one rank each.
    """

    @parametrize("devices", [True, False])
    def test_recover_while_collectives_in_flight_complete_on_enqueue(self, devices):
        # As NCCL's: the held collectives' futures complete at once, and their
        # writes come later, on a stream of their own. Without devices, as a
        # Python process group's or hook's can: it orders no stream after them.
        for old in self._recover_while_collectives_in_flight(
            gradient_as_bucket_view=True
        ):
            old.complete_on_enqueue = True
            old.future_devices = devices

    def test_recover_when_finalize_fails_complete_on_enqueue(self):
        # As on NCCL: the futures of the collectives after the failed one have
        # completed, as they were enqueued, and their writes come later. They
        # are abandoned all the same.
        for old in self._recover_when_finalize_fails():
            old.complete_on_enqueue = True

    def _nccl_groups_of_one(self, count, **kwargs):
        """Returns ``count`` NCCL groups that hold this rank alone.

        Every rank creates every rank's groups, as ``new_group()`` requires,
        with ``kwargs``.
        """
        mine = []
        for _ in range(count):
            groups = [
                dist.new_group([rank], backend="nccl", **kwargs)
                for rank in range(self.world_size)
            ]
            mine.append(groups[self.rank])
        return mine

    @requires_nccl()
    def test_switch_between_nccl_groups_of_one(self):
        self._init_default_group()
        first, second = self._nccl_groups_of_one(2)
        everyone = list(range(self.world_size))
        world_pg = dist.new_group(everyone)
        alone = [self.rank]
        ddp = self._ddp(process_group=first)
        cnt = self._compile_counter()
        model = torch.compile(ddp, backend=cnt)
        self._step(ddp, alone, 0, model=model)
        frames = cnt.frame_count
        changes = [(second, alone), (world_pg, everyone), (first, alone)]
        for step, (pg, members) in enumerate(changes, 1):
            ddp._update_process_group(pg)
            self.assertIs(ddp.process_group, pg)
            self._step(ddp, members, step, model=model)
        self.assertEqual(cnt.frame_count, frames, msg="changing the group recompiled")

    @requires_nccl()
    @parametrize("raise_at", ["input", "fc2"])
    def test_recover_on_nccl_groups_of_one(self, raise_at):
        self._init_default_group()
        first, second = self._nccl_groups_of_one(2)
        alone = [self.rank]
        ddp = self._ddp(process_group=first)
        self._step(ddp, alone, 0)
        self._failed_step(ddp, 1, raise_at=raise_at)
        ddp._update_process_group(second)
        for step in range(2, 4):
            self._step(ddp, alone, step)

    @requires_nccl()
    def test_cpu_module_refuses_nccl_group(self):
        # The call's first collective fails on every rank, as NCCL has no
        # backend for CPU tensors, before anything changes.
        self._init_default_group()
        (nccl_pg,) = self._nccl_groups_of_one(1)
        everyone = list(range(self.world_size))
        gloo_pg = dist.new_group(everyone, backend="gloo")
        torch.manual_seed(0)
        ddp = DistributedDataParallel(Net(), process_group=gloo_pg)
        with self.assertRaisesRegex(
            RuntimeError, "No backend type associated with device type cpu"
        ):
            ddp._update_process_group(nccl_pg)
        self.assertIs(ddp.process_group, gloo_pg)
        _loss(ddp(_sample(self.rank, 0, "cpu"))).backward()
        # Each rank had its own batch: only a reduction makes them agree.
        self._assert_identical([p.grad for p in ddp.parameters()], gloo_pg, everyone)

    @requires_nccl()
    def test_sync_batch_norm_statistics_follow_group(self):
        # SyncBatchNorm synchronizes only in training, and only on CUDA: the
        # running mean after one training step is that of the batches of the
        # members of the layer's group, which follows DDP's.
        self._init_default_group()
        (alone_pg,) = self._nccl_groups_of_one(1)
        everyone = list(range(self.world_size))
        world_pg = dist.new_group(everyone)
        ddp = self._ddp(module_cls=NetWithSyncBatchNorm, process_group=alone_pg)
        ddp.module.bn.process_group = alone_pg
        changes = [
            (alone_pg, [self.rank]),
            (world_pg, everyone),
            (alone_pg, [self.rank]),
        ]
        for step, (pg, members) in enumerate(changes):
            ddp._update_process_group(pg)
            self.assertIs(ddp.module.bn.process_group, pg)
            ddp.module.bn.reset_running_stats()
            with torch.no_grad():
                batches = [
                    F.relu(ddp.module.fc1(_sample(m, step, self.device)))
                    for m in members
                ]
                expected = 0.1 * torch.cat(batches).mean(0)
            _loss(ddp(_sample(self.rank, step, self.device))).backward()
            self.assertEqual(
                ddp.module.bn.running_mean,
                expected,
                msg=f"step {step}: not the statistics of members {members}",
            )

    @requires_nccl()
    def test_recover_after_aborting_the_old_nccl_group(self):
        # What the docstring tells a rank that recovers on NCCL to do. The
        # last rank leaves the old group without a word, as a rank that died
        # does: the others' backward pass returns, but its allreduce waits for
        # that rank on the NCCL stream, which an event recorded after the pass
        # shows. They abort the old group, with the watchdog's error handling
        # off, and train on in a new group of their own, past the old group's
        # timeout.
        if self.backend != "nccl":
            self.skipTest("needs a GPU per rank, and NCCL on each")
        old_timeout_s = 5.0
        # Release 2.1 reads NCCL_ASYNC_ERROR_HANDLING; TORCH_ came with 2.2.
        error_handling_off = {"NCCL_ASYNC_ERROR_HANDLING": "0"}
        self._init_default_group()
        everyone = list(range(self.world_size))
        survivors = everyone[:-1]
        with mock.patch.dict(os.environ, error_handling_off):
            old_pg = dist.new_group(everyone, timeout=timedelta(seconds=old_timeout_s))
        survivors_pg = dist.new_group(survivors)
        ddp = self._ddp(process_group=old_pg)
        self._step(ddp, everyone, 0)
        if self.rank not in survivors:
            return
        _loss(ddp(_sample(self.rank, 1, self.device))).backward()
        done = torch.cuda.Event()
        done.record()
        # Not a race: nothing completes the allreduce but the abort. The
        # deadline is the detection the docstring describes.
        deadline = time.monotonic() + old_timeout_s / 2
        while time.monotonic() < deadline and not done.query():
            time.sleep(0.05)
        self.assertFalse(done.query(), msg="the allreduce without its peer completed")
        failed_at = time.monotonic()
        old_pg._get_backend(torch.device("cuda"))._abort()
        ddp._update_process_group(survivors_pg)
        for step in range(2, 4):
            self._step(ddp, survivors, step)
        time.sleep(max(0.0, failed_at + old_timeout_s + 4.0 - time.monotonic()))
        for step in range(4, 6):
            self._step(ddp, survivors, step)


@requires_gloo()
class UpdateProcessGroupGlooTest(UpdateProcessGroupTest, MultiProcessTestCase):
    backend = "gloo"

    @property
    def device(self):
        return torch.device("cpu")

    # Every rank draws the same plans: hypothesis derandomized, without
    # shrinking, which would follow each rank's own failures. Each example
    # costs a few seconds; DDP_UPDATE_PG_EXAMPLES asks for more.
    def test_random_group_changes(self):
        examples = []
        # Release 2.1 deadlocks when the last reference to a Gloo group drops
        # while one of its workers frees a tensor that Python has let go of:
        # ~ProcessGroupGloo joins that worker holding the GIL, which the
        # worker waits for (upstream #154976, "Release GIL in PG destructor",
        # fixed it). This test drops dozens of groups, so it keeps them until
        # the rank exits, which _run does without destroying them.
        groups = []

        @hypothesis.settings(
            max_examples=int(os.environ.get("DDP_UPDATE_PG_EXAMPLES", "4")),
            deadline=None,
            derandomize=True,
            database=None,
            phases=(hypothesis.Phase.explicit, hypothesis.Phase.generate),
            suppress_health_check=list(hypothesis.HealthCheck),
        )
        @hypothesis.given(plan=_plans(world_size=self.world_size))
        def run(plan):
            examples.append(plan)
            try:
                self._run_plan(plan, f"{self.file_name}.{len(examples)}", groups)
            finally:
                if dist.is_initialized():
                    dist.destroy_process_group()

        run()
        self.assertGreater(len(examples), 0)

    def _run_plan(self, plan, store_prefix, groups):
        """Runs ``plan`` on this rank, checking every step against the reference.

        Every group it creates is appended to ``groups``.
        """
        rank = self.rank
        world = list(range(self.world_size))
        self._init_default_group(file_name=f"{store_prefix}.init")
        groups.append(dist.group.WORLD)
        ddp = self._ddp(find_unused_parameters=plan.find_unused_parameters)
        cnt = self._compile_counter()
        model = torch.compile(ddp, backend=cnt)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)

        def new_group(members):
            # Called on every rank of the current default group, in plan order.
            if rank not in world:
                return dist.GroupMember.NON_GROUP_MEMBER
            groups.append(dist.new_group(sorted(world.index(m) for m in members)))
            return groups[-1]

        # Compile every variant of the forward pass that the plan runs: with
        # and without fc2, and with an input that requires grad, as a failing
        # step's.
        self._step(ddp, world, 0, model=model, optimizer=optimizer)
        if plan.find_unused_parameters:
            self._step(ddp, world, 1, use_fc2=False, model=model, optimizer=optimizer)
        self._failed_step(ddp, 2, model=model)
        ddp._update_process_group(new_group(world))
        frames = cnt.frame_count
        step = 3
        for index, change in enumerate(plan.changes):
            if change.reinit:
                if rank in world:
                    dist.destroy_process_group()
                world = list(change.members)
                group = dist.GroupMember.NON_GROUP_MEMBER
                if rank in world:
                    self._init_default_group(
                        world_size=len(world),
                        rank=world.index(rank),
                        file_name=f"{store_prefix}.reinit{index}",
                    )
                    group = dist.group.WORLD
                    groups.append(group)
            else:
                group = new_group(change.members)
            # Ranks that come back have not trained meanwhile.
            ddp._update_process_group(group, sync_module_states=rank in change.members)
            members = list(change.members)
            if rank in members:
                self._step(
                    ddp, members, step, change.use_fc2, model=model, optimizer=optimizer
                )
            step += 1
            if change.error_in_backward:
                if rank in members:
                    self._failed_step(ddp, step, model=model)
                recovery = (
                    new_group(members)
                    if rank in world
                    else dist.GroupMember.NON_GROUP_MEMBER
                )
                ddp._update_process_group(recovery)
                if rank in members:
                    self._step(
                        ddp,
                        members,
                        step + 1,
                        change.use_fc2,
                        model=model,
                        optimizer=optimizer,
                    )
                step += 2
            self.assertEqual(cnt.frame_count, frames, msg=f"change {index} recompiled")


@requires_gloo()
@skip_but_pass_in_sandcastle_if(
    not torch.cuda.is_available(), "Gloo on CUDA: needs a GPU"
)
class UpdateProcessGroupGlooCudaTest(
    UpdateProcessGroupCudaTest, UpdateProcessGroupTest, MultiProcessTestCase
):
    """Gloo reduces CUDA tensors: every rank's parameters on the same GPU."""

    backend = "gloo"

    @property
    def device(self):
        return torch.device("cuda", 0)


@requires_nccl()
@skip_but_pass_in_sandcastle_if(
    torch.cuda.device_count() < 2, "NCCL: needs at least 2 GPUs"
)
class UpdateProcessGroupNcclTest(
    UpdateProcessGroupCudaTest, UpdateProcessGroupTest, MultiProcessTestCase
):
    backend = "nccl"

    @property
    def world_size(self):
        return min(4, torch.cuda.device_count())

    @property
    def device(self):
        return torch.device("cuda", self.rank)


if __name__ == "__main__":
    run_tests()
