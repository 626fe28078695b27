# Owner(s): ["oncall: distributed"]

import copy
import os
import sys
import time
from datetime import timedelta
from unittest import mock

import torch
import torch.distributed as dist

if not dist.is_available():
    print("Distributed not available, skipping tests", file=sys.stderr)
    sys.exit(0)

import torch._dynamo
import torch._dynamo.testing
import torch.nn as nn
import torch.nn.functional as F
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


def _sample(owner, step, device):
    """The batch that the process with original rank ``owner`` trains on at ``step``."""
    gen = torch.Generator().manual_seed(1000 * step + owner)
    return torch.randn(4, 6, generator=gen).to(device)


def _loss(out):
    return out.pow(2).sum()


@instantiate_parametrized_tests
class UpdateProcessGroupTestBase:
    """Cases shared by the Gloo and NCCL classes.

    Every case checks the gradients of each step against a reference computed
    locally: the average, over the members of the *current* group, of the
    gradients that a plain copy of the module gets on each member's batch.
    Members are named by their original rank, which stays their identity when
    the default group is re-initialized with other rank numbers.
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

    def tearDown(self):
        super().tearDown()
        try:
            os.remove(self.file_name)
        except OSError:
            pass

    # Helpers

    def _init_default_group(self, world_size=None, rank=None, file_name=None):
        dist.init_process_group(
            self.backend,
            store=dist.FileStore(file_name or self.file_name, world_size or self.world_size),
            rank=self.rank if rank is None else rank,
            world_size=world_size or self.world_size,
        )

    def _ddp(self, module_cls=Net, **kwargs):
        torch.manual_seed(0)
        module = module_cls().to(self.device)
        device_ids = [self.device] if self.device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=device_ids, **kwargs)

    def _compile_counter(self):
        torch._dynamo.reset()
        return torch._dynamo.testing.CompileCounter()

    def _reference_grads(self, module, members, step, use_fc2):
        reference = copy.deepcopy(module)
        total = [torch.zeros_like(p) for p in reference.parameters()]
        for member in members:
            reference.zero_grad(set_to_none=True)
            _loss(reference(_sample(member, step, self.device), use_fc2)).backward()
            for acc, p in zip(total, reference.parameters()):
                if p.grad is not None:
                    acc += p.grad
        return [acc / len(members) for acc in total]

    def _step(self, model, ddp, members, step, use_fc2=True, optimizer=None):
        """Trains one step and checks every gradient against the reference."""
        expected = self._reference_grads(ddp.module, members, step, use_fc2)
        ddp.zero_grad(set_to_none=True)
        _loss(model(_sample(self.rank, step, self.device), use_fc2)).backward()
        for (name, p), want in zip(ddp.module.named_parameters(), expected):
            got = p.grad if p.grad is not None else torch.zeros_like(p)
            self.assertEqual(
                got,
                want,
                msg=f"rank {self.rank}: gradient of {name} at step {step} is not "
                f"the average over members {members}",
            )
        if optimizer is not None:
            optimizer.step()

    def _failed_step(self, model, ddp, step, raise_at="input", delay_s=0.0):
        """Runs a backward pass that raises part way through.

        ``raise_at="input"`` raises once every parameter has its gradient, so
        every bucket's allreduce has been launched; ``"fc2"`` raises before
        fc2 and fc1 have theirs, so only buckets that hold nothing but fc3's
        parameters have been.
        ``delay_s`` makes this rank reach fc1's gradient late, which keeps the
        allreduces of the other ranks in flight for that long.
        """
        handles = []

        def fail(grad):
            raise SimulatedError(f"simulated failure on rank {self.rank}")

        def delay(grad):
            time.sleep(delay_s)

        x = _sample(self.rank, step, self.device).requires_grad_()
        if raise_at == "input":
            x = _RaiseInBackward.apply(x)
        else:
            handles.append(ddp.module.fc2.weight.register_hook(fail))
        if delay_s:
            handles.append(ddp.module.fc1.weight.register_hook(delay))
        try:
            with self.assertRaises(SimulatedError):
                _loss(model(x)).backward()
        finally:
            for handle in handles:
                handle.remove()

    def _sync_params(self, ddp, src):
        """What a user does today before growing: give joining ranks the members' weights."""
        for p in ddp.module.parameters():
            dist.broadcast(p.data, src)

    # Cases

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

        self._step(model, ddp, everyone, 0, optimizer=optimizer)
        frames = cnt.frame_count
        self.assertGreater(frames, 0)

        for members, pg in ((first, first_pg), (second, second_pg)):
            ddp._update_process_group(pg)
            if self.rank in members:
                self.assertIs(ddp.process_group, pg)
                for step in range(1, 4):
                    self._step(model, ddp, members, step, optimizer=optimizer)
        ddp._update_process_group(world_pg)
        self.assertIs(ddp.process_group, world_pg)
        self._sync_params(ddp, src=first[0])
        for step in range(4, 7):
            self._step(model, ddp, everyone, step, optimizer=optimizer)
        self.assertEqual(cnt.frame_count, frames, msg="changing the group recompiled")

    def test_reinit_default_group_renumbered(self):
        # The seed's pattern: the default group is torn down and set up again
        # with fewer ranks, which renumbers them, and later with all of them.
        self._init_default_group()
        ddp = self._ddp()
        cnt = self._compile_counter()
        model = torch.compile(ddp, backend=cnt)
        self._step(model, ddp, list(range(self.world_size)), 0)
        frames = cnt.frame_count

        survivors = list(range(1, self.world_size))
        dist.destroy_process_group()
        if self.rank in survivors:
            self._init_default_group(
                world_size=len(survivors),
                rank=survivors.index(self.rank),
                file_name=self.file_name + ".survivors",
            )
            ddp._update_process_group(dist.group.WORLD)
            self.assertEqual(dist.get_world_size(ddp.process_group), len(survivors))
            for step in range(1, 4):
                self._step(model, ddp, survivors, step)
            dist.destroy_process_group()

        self._init_default_group(file_name=self.file_name + ".everyone")
        ddp._update_process_group(dist.group.WORLD)
        for step in range(4, 7):
            self._step(model, ddp, list(range(self.world_size)), step)
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
        self._step(model, ddp, everyone, 0)
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        self.assertGreater(graphs, 0)
        ddp._update_process_group(first_pg)
        if self.rank in first:
            self._step(model, ddp, first, 1)
        ddp._update_process_group(world_pg)
        self._step(model, ddp, everyone, 2)
        self.assertEqual(
            torch._dynamo.utils.counters["stats"]["unique_graphs"],
            graphs,
            msg="changing the group recompiled",
        )

    @parametrize("find_unused_parameters", [False, True])
    @parametrize("raise_at", ["input", "fc2"])
    def test_recover_after_error_in_backward(self, find_unused_parameters, raise_at):
        self._init_default_group()
        ddp = self._ddp(find_unused_parameters=find_unused_parameters)
        cnt = self._compile_counter()
        model = torch.compile(ddp, backend=cnt)
        everyone = list(range(self.world_size))
        recovery_pg = dist.new_group(everyone)

        self._step(model, ddp, everyone, 0)
        self._failed_step(model, ddp, 1, raise_at=raise_at)
        frames = cnt.frame_count
        ddp._update_process_group(recovery_pg)
        for step in range(2, 5):
            self._step(model, ddp, everyone, step)
        self.assertEqual(cnt.frame_count, frames, msg="recovering recompiled")

    def test_recover_with_other_unused_parameters(self):
        # The failed pass used fc2, the next ones do not: nothing of the failed
        # pass's record of used parameters may survive the reset (#128092).
        self._init_default_group()
        ddp = self._ddp(find_unused_parameters=True)
        everyone = list(range(self.world_size))
        recovery_pg = dist.new_group(everyone)
        self._step(ddp, ddp, everyone, 0)
        self._failed_step(ddp, ddp, 1, raise_at="input")
        ddp._update_process_group(recovery_pg)
        for step in range(2, 4):
            self._step(ddp, ddp, everyone, step, use_fc2=False)
            self.assertIsNone(ddp.module.fc2.weight.grad, msg="an unused parameter got a gradient")
        self._step(ddp, ddp, everyone, 4, use_fc2=True)

    @parametrize("find_unused_parameters", [False, True])
    @parametrize("gradient_as_bucket_view", [False, True])
    def test_recover_while_allreduce_in_flight(self, find_unused_parameters, gradient_as_bucket_view):
        # Rank 1 reaches fc1's gradient late in the failed pass, so the other
        # ranks' allreduces of that pass are still in flight, on the buckets,
        # when they recover and run the next step. Those allreduces complete
        # once rank 1 catches up, and must not land in the next step's buckets.
        self._init_default_group()
        ddp = self._ddp(
            find_unused_parameters=find_unused_parameters,
            gradient_as_bucket_view=gradient_as_bucket_view,
        )
        everyone = list(range(self.world_size))
        recovery_pg = dist.new_group(everyone)
        self._step(ddp, ddp, everyone, 0)
        self._failed_step(ddp, ddp, 1, raise_at="input", delay_s=2.0 if self.rank == 1 else 0.0)
        ddp._update_process_group(recovery_pg)
        if self.rank != 1:
            grads = [p.grad for p in ddp.parameters()]
            if gradient_as_bucket_view:
                # Views of a bucket that is still being written are dropped.
                self.assertEqual(grads, [None] * len(grads))
            else:
                # Gradients in their own memory keep the failed pass's values.
                self.assertTrue(all(g is not None for g in grads))
        for step in range(2, 4):
            self._step(ddp, ddp, everyone, step)

    def test_recover_when_old_group_is_dead(self):
        # The upper half of the ranks stop issuing collectives on the old group
        # (as if they had died), so the lower half's allreduces of the failed
        # pass never complete, until the old group's timeout fails them.
        # Recovering must neither wait for them nor be disturbed when they fail.
        self._init_default_group()
        everyone = list(range(self.world_size))
        half = self.world_size // 2
        old_timeout_s = 15.0
        old_pg = dist.new_group(everyone, timeout=timedelta(seconds=old_timeout_s))
        recovery_pg = dist.new_group(everyone)
        ddp = self._ddp(process_group=old_pg)
        self._step(ddp, ddp, everyone, 0)
        failed_at = time.monotonic()
        if self.rank < half:
            self._failed_step(ddp, ddp, 1, raise_at="input")
        else:
            self._failed_step(ddp, ddp, 1, raise_at="fc2")
        ddp._update_process_group(recovery_pg)
        # Not a speed check: waiting for the dead group would take the whole
        # timeout, and this bound leaves a wide margin below it.
        self.assertLess(
            time.monotonic() - failed_at,
            old_timeout_s / 3,
            msg="recovering waited for the dead group",
        )
        for step in range(2, 4):
            self._step(ddp, ddp, everyone, step)
        time.sleep(max(0.0, failed_at + old_timeout_s + 1.0 - time.monotonic()))
        for step in range(4, 6):
            self._step(ddp, ddp, everyone, step)

    def test_bad_argument_changes_nothing(self):
        self._init_default_group()
        ddp = self._ddp()
        everyone = list(range(self.world_size))
        group = ddp.process_group
        self._step(ddp, ddp, everyone, 0)
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
        self.assertIs(ddp.process_group, group)
        for step in range(1, 3):
            self._step(ddp, ddp, everyone, step)

    def test_gradient_as_bucket_view(self):
        self._init_default_group()
        ddp = self._ddp(gradient_as_bucket_view=True)
        everyone = list(range(self.world_size))
        first = everyone[: self.world_size // 2]
        first_pg = dist.new_group(first)
        world_pg = dist.new_group(everyone)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
        for step in range(2):
            self._step(ddp, ddp, everyone, step, optimizer=optimizer)
        ddp._update_process_group(first_pg)
        if self.rank in first:
            for step in range(2, 5):
                self._step(ddp, ddp, first, step, optimizer=optimizer)
        ddp._update_process_group(world_pg)
        self._sync_params(ddp, src=first[0])
        for step in range(5, 7):
            self._step(ddp, ddp, everyone, step, optimizer=optimizer)
            # The model fits one bucket, so every gradient is a view of it.
            storages = {p.grad.untyped_storage().data_ptr() for p in ddp.parameters()}
            self.assertEqual(len(storages), 1, msg="gradients are not views of the bucket")

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
            self.assertEqual(seen, [torch.full((3,), float(second[0]), device=self.device)])
            for step in range(1, 3):
                self._step(ddp, ddp, second, step)

    def test_several_buckets(self):
        self._init_default_group()
        # About one parameter per bucket, the first bucket included.
        with mock.patch.object(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 100):
            ddp = self._ddp(bucket_cap_mb=1e-4)
        everyone = list(range(self.world_size))
        first = everyone[: self.world_size // 2]
        first_pg = dist.new_group(first)
        recovery_pg = dist.new_group(everyone)
        world_pg = dist.new_group(everyone)
        self._step(ddp, ddp, everyone, 0)
        # Buckets are rebuilt from the gradients' ready order in this step.
        self._step(ddp, ddp, everyone, 1)
        self.assertGreater(len(ddp.reducer._get_zeros_like_grad_buckets()), 2)
        ddp._update_process_group(first_pg)
        if self.rank in first:
            for step in range(2, 5):
                self._step(ddp, ddp, first, step)
        ddp._update_process_group(world_pg)
        for step in range(5, 7):
            self._step(ddp, ddp, everyone, step)
        self._failed_step(ddp, ddp, 7, raise_at="fc2")
        ddp._update_process_group(recovery_pg)
        for step in range(8, 10):
            self._step(ddp, ddp, everyone, step)


@requires_gloo()
class UpdateProcessGroupGlooTest(UpdateProcessGroupTestBase, MultiProcessTestCase):
    backend = "gloo"

    @property
    def device(self):
        return torch.device("cpu")


@requires_nccl()
@skip_but_pass_in_sandcastle_if(
    torch.cuda.device_count() < 2, "NCCL: needs at least 2 GPUs"
)
class UpdateProcessGroupNcclTest(UpdateProcessGroupTestBase, MultiProcessTestCase):
    backend = "nccl"

    @property
    def world_size(self):
        return max(2, min(4, torch.cuda.device_count()))

    @property
    def device(self):
        return torch.device("cuda", self.rank)


if __name__ == "__main__":
    run_tests()
