"""Elastic DDP: ranks are SIGKILLed and come back, and training goes on, on Gloo or NCCL.

A launcher hosts a TCPStore and starts one process per worker. Every worker wraps a small
transformer in DistributedDataParallel once, compiles it once, and keeps both for its whole
life; each change of membership goes through DistributedDataParallel._update_process_group.

- Shrink: a worker that is told to (--kill UID:STEP:PHASE) SIGKILLs itself in the forward
  pass, the backward pass or the optimizer step of that step. The others see their next
  collective fail (Gloo reports the closed connection, or the group's timeout ends it),
  release the failed group's connections at once (release_failed_group: a peer still blocked
  in the same collective then fails too, instead of at the timeout), report it in the store,
  and wait. The launcher takes the workers whose heartbeats are fresh as the
  survivors, and writes the next generation's plan into the store: its members, the member
  whose state everyone takes, and the step to go on from, the last step any survivor completed,
  plus one.
- Grow: a worker started later (--rejoin STEP) registers in the store. At the next step
  boundary the members stop, and the new generation includes it; it gets parameters, buffers
  (sync_module_states=True) and optimizer state from a member. A new worker that registers
  only after training has finished is not admitted; with --wait-for-joiners the members wait
  before the last step, for up to --join-timeout, until every new worker is in.

Every step, every member checks that the parameters are bitwise identical on all members (a
digest, all-gathered), that nothing was compiled again, and the launcher checks at the end
that no step that a member completed was lost.

With --reconfigure (Gloo, torch 2.14 or later), each worker has one process group for its
whole life: made with enable_reconfigure=True and reconfigured in place to itself alone to
wrap and compile, then reconfigured in place (torch.distributed._reconfigure) to each
generation's members, and passed to _update_process_group as it is; nothing is destroyed
or initialized again.

With --backend nccl, each worker trains on a GPU of its own, and DDP reduces over NCCL; the
digests and the optimizer state still go over Gloo, as the group has both ("cpu:gloo,cuda:nccl").
An NCCL collective whose peer died does not fail: the backward pass returns, and the step's
kernels wait on the GPU. So a member waits for the GPU after each backward pass, for half the
group's timeout at most, and takes a wait that runs out as a failed collective; before the next
generation it aborts the old group's NCCL communicators, which ends those kernels, with the
watchdog's error handling off (set for the workers unless the environment sets it).

    python examples/elastic_ddp.py --workers 4 --steps 30 --kill 3:8:backward --rejoin 14
    python examples/elastic_ddp.py --reconfigure --workers 4 --steps 30 --kill 3:8:backward --rejoin 14
    python examples/elastic_ddp.py --backend nccl --workers 2 --steps 30 --kill 1:8:backward --rejoin 14

Run it in the overlay venv (scripts/overlay install), or on a torch that has the series.
"""

import argparse
import bisect
import dataclasses
import datetime
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Tuple

import torch
import torch._dynamo
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.torch_version import TorchVersion
from torch.utils._pytree import tree_map

PHASES = ("forward", "backward", "optimizer")
EXIT_NOT_ADMITTED = 3
EXIT_STORE_GONE = 4
HEARTBEAT_S = 0.5
STORE_TIMEOUT_S = 30.0
# With --reconfigure, the uuid of the reconfigure that gives worker UID a group of its own is
# SOLO_UUID + UID; each generation's is its number; the one that releases generation G's
# group on worker UID after a failure is release_uuid(UID, G).
SOLO_UUID = 1 << 30
RELEASE_UUID = 1 << 40


class TinyTransformer(nn.Module):
    def __init__(self, vocab=64, dim=32, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(
                dim, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True
            ),
            num_layers=layers,
        )
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        return self.head(self.blocks(self.embed(tokens)))


def batch(step: int, rank: int):
    """Rank ``rank``'s sequences of ``step``.

    Every rank trains the same number of sequences, so that the compiled code sees the same
    shapes whatever the world size, and the global batch grows and shrinks with the world.
    """
    gen = torch.Generator().manual_seed(1000 * step + rank)
    tokens = torch.randint(0, 64, (2, 16), generator=gen)
    return tokens[:, :-1], tokens[:, 1:]


@dataclasses.dataclass
class Plan:
    """One generation: who trains, whose state everyone takes, and from which step."""

    generation: int
    members: List[int]
    src: int
    step: int

    def dump(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def load(cls, text: bytes) -> "Plan":
        return cls(**json.loads(text))


# The worker


class StoreGone(Exception):
    pass


class NotAdmitted(Exception):
    pass


def counter(store, key: str) -> int:
    """Reads a key that only ever holds an integer, 0 while it is unset, without waiting."""
    return int(store_op(store.add, key, 0))


def store_op(fn, *args):
    try:
        return fn(*args)
    except RuntimeError as e:  # TCPStore reports a lost server as RuntimeError
        raise StoreGone(str(e)) from e


def compiled_graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def digest(module: nn.Module) -> str:
    flat = torch.cat([p.detach().flatten() for p in module.parameters()])
    return hashlib.sha256(flat.cpu().numpy().tobytes()).hexdigest()[:16]


def group_backend(args) -> str:
    # NCCL for DDP's CUDA tensors, Gloo for the CPU tensors of the digests and the optimizer
    # state, which then fail on a dead peer or a timeout instead of waiting forever.
    return "cpu:gloo,cuda:nccl" if args.backend == "nccl" else "gloo"


def wait_for_gpu(timeout_s: float) -> None:
    """Waits for the work queued on the current stream, which includes the step's collectives.

    An NCCL collective whose peer died never completes, and nothing raises where DDP waits for
    it; this raises instead, once ``timeout_s`` is over.
    """
    done = torch.cuda.Event()
    done.record()
    deadline = time.monotonic() + timeout_s
    while not done.query():
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the GPU did not finish the step's collectives within {timeout_s:.1f} s"
            )
        time.sleep(0.001)


def abort_nccl(group) -> None:
    """Aborts ``group``'s NCCL communicators, which ends the kernels that wait for a dead peer.

    The group can then only be destroyed: nothing more may be issued on it.
    """
    if hasattr(dist.distributed_c10d, "_abort_process_group"):
        dist.distributed_c10d._abort_process_group(group)  # also destroys it
    else:  # torch 2.1
        group._get_backend(torch.device("cuda"))._abort()
        dist.destroy_process_group(group)


def nccl_error_handling_off() -> Dict[str, str]:
    """The environment under which ProcessGroupNCCL's watchdog lets a rank abort a group and go on.

    With the default error handling, the watchdog ends the process at a collective's timeout,
    and on torch 2.1 also as soon as it finds a communicator aborted with a collective pending.
    """
    if TorchVersion(torch.__version__) < (2, 2):
        return {"NCCL_ASYNC_ERROR_HANDLING": "0"}
    return {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}


def reconfigure(
    store, uid: int, members: List[int], uuid: int, timeout_s: float
) -> None:
    """Reconfigures the default group in place to ``members``, in that order; the handles go
    through the store. A member that does not publish its handle in time fails the call, as a
    collective with a dead peer does."""
    store.set(f"handle/{uuid}/{uid}", dist._get_reconfigure_handle())
    handles = [store.get(f"handle/{uuid}/{member}").decode() for member in members]
    dist._reconfigure(
        uuid=uuid, handles=handles, timeout=datetime.timedelta(seconds=timeout_s)
    ).wait()


def gather_with_stop(
    store, generation: int, world_size: int, value
) -> Tuple[list, int]:
    """All-gathers ``value`` with this member's reading of the generation's stop, which the
    launcher sets to the last step of the generation plus one; returns the values and the last
    step, -1 for none. The members take the earliest stop any of them read, so that all stop at
    the same step boundary whenever the launcher wrote it."""
    gathered: list = [None] * world_size
    dist.all_gather_object(
        gathered, (value, counter(store, f"gen/{generation}/stop_after"))
    )
    stops = [stop - 1 for _, stop in gathered if stop > 0]
    return [v for v, _ in gathered], min(stops, default=-1)


def release_uuid(uid: int, generation: int) -> int:
    """Returns the uuid of the reconfigure that releases generation ``generation``'s group on
    worker ``uid``: fresh, and unique to the worker and the generation."""
    return RELEASE_UUID + (generation << 20) + uid


def release_failed_group(ddp, uid: int, generation: int, in_place: bool) -> None:
    """Closes the connections of the default group, whose step failed or was given up, at once.

    In Gloo's ring only the lost rank's two neighbours see their connections close; a peer
    blocked in the same collective learns of the loss when the connection it waits on closes,
    or at the group's timeout. So every survivor closes its own at once, and they fail one ring
    hop after another. In place (``in_place``, a group made with enable_reconfigure=True), it
    reconfigures the group onto this process alone; else it moves DDP onto a group of this
    process alone, which lets go of the old group, and destroys it. Call it outside the except
    clause of the failure: nothing may reference the failed step's Work (the exception's
    traceback does), as that keeps the old connections open.
    """
    if in_place:
        dist._reconfigure(
            uuid=release_uuid(uid, generation),
            handles=[dist._get_reconfigure_handle()],
        ).wait()
    elif dist.is_initialized():  # else the failure came before the group was made
        solo = dist.new_group([dist.get_rank()], use_local_synchronization=True)
        ddp._update_process_group(solo)
        dist.destroy_process_group()


def wait_for_plan(store, uid: int, generation: int, deadline_s: float) -> Plan:
    """Waits until the launcher publishes generation ``generation`` or a later one."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if counter(store, "finished"):
            raise NotAdmitted(
                f"training finished before a generation took worker {uid} in"
            )
        current = counter(store, "gen/current")
        if current >= generation:
            plan = Plan.load(store_op(store.get, f"gen/{current}/plan"))
            if uid not in plan.members:
                raise NotAdmitted(f"generation {current} goes on without worker {uid}")
            return plan
        time.sleep(0.1)
    raise NotAdmitted(f"no generation took worker {uid} in within {deadline_s:.0f} s")


class Heartbeat:
    """Beats into the store from a thread of its own, and ends the process if the store goes silent.

    The thread must be stopped before the interpreter finalizes: CPython ends a daemon thread
    that is inside a TCPStore call then with pthread_exit, whose unwinding through pybind11's
    noexcept GIL guard aborts the process ("terminate called without an active exception").
    """

    def __init__(self, store, uid: int, address: str):
        self.store, self.uid, self.address = store, uid, address
        self.last = time.monotonic()
        self.stopped = threading.Event()
        self.threads = [
            threading.Thread(target=self.beat),
            threading.Thread(target=self.watch),
        ]
        for thread in self.threads:
            thread.start()

    def beat(self):
        while not self.stopped.is_set():
            try:
                self.store.set(f"hb/{self.uid}", str(int(time.time() * 1000)))
                self.store.add(
                    f"beats/{self.uid}", 1
                )  # set() does not wait for the store's answer; add() does
            except RuntimeError:
                return
            self.last = time.monotonic()
            self.stopped.wait(HEARTBEAT_S)

    def watch(self):
        # A store op on a host cut off from the network may block for much longer than the
        # store's timeout; the heartbeat going silent tells.
        while time.monotonic() - self.last < STORE_TIMEOUT_S:
            if self.stopped.wait(HEARTBEAT_S):
                return
        print(
            f"[worker {self.uid}] error: the store at {self.address} has not answered for "
            f"{STORE_TIMEOUT_S:.0f} s; exiting",
            flush=True,
        )
        os._exit(EXIT_STORE_GONE)

    def stop(self):
        """Returns once neither thread runs; a store op under way ends within the store's timeout."""
        self.stopped.set()
        for thread in self.threads:
            thread.join()


def worker(args) -> int:
    uid = args.uid
    timeout = datetime.timedelta(seconds=STORE_TIMEOUT_S)
    store = dist.TCPStore(args.host, args.port, is_master=False, timeout=timeout)
    beat = dist.TCPStore(args.host, args.port, is_master=False, timeout=timeout)

    heartbeat = Heartbeat(beat, uid, f"{args.host}:{args.port}")
    try:
        return train(args, store)
    finally:
        heartbeat.stop()


def train(args, store) -> int:
    uid = args.uid
    kill: Optional[tuple] = None
    for spec in args.kill:
        who, step, phase = spec.split(":")
        if int(who) == uid:
            kill = (int(step), phase)

    # Build, wrap and compile once, on a group of this process alone, before joining.
    torch.manual_seed(0)
    device = torch.device("cpu")
    if args.backend == "nccl":
        device = torch.device("cuda", args.gpu)
        torch.cuda.set_device(device)
    model = TinyTransformer().to(device)
    if args.reconfigure:
        # The rank names this process in its reconfigure handles; the group's peers are the
        # ones each reconfigure gives it.
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore("pg", store),
            rank=uid,
            world_size=uid + 1,
            timeout=datetime.timedelta(seconds=args.timeout),
            enable_reconfigure=True,
        )
        reconfigure(store, uid, [uid], SOLO_UUID + uid, args.timeout)
    else:
        dist.init_process_group(
            group_backend(args),
            store=dist.PrefixStore(f"solo/{uid}", store),
            rank=0,
            world_size=1,
        )
    store_op(store.add, f"inits/{uid}", 1)
    group = dist.group.WORLD
    ddp = DistributedDataParallel(
        model, device_ids=[device] if device.type == "cuda" else None
    )
    compiled = torch.compile(ddp, backend=args.compile_backend)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    inputs, targets = (t.to(device) for t in batch(0, 0))
    loss_fn(compiled(inputs).flatten(0, 1), targets.flatten()).backward()
    optimizer.zero_grad(set_to_none=True)
    graphs = compiled_graphs()

    index = int(store_op(store.add, "join/n", 1))
    store_op(store.set, f"join/{index}", str(uid))
    generation = counter(store, "gen/current") + 1
    while True:
        plan = wait_for_plan(store, uid, generation, args.join_timeout)
        rank, world_size = plan.members.index(uid), len(plan.members)
        src = plan.members.index(plan.src)
        step = plan.step
        failure = None  # the first line of a failed collective's error
        try:
            if args.reconfigure:
                reconfigure(store, uid, plan.members, plan.generation, args.timeout)
                assert (
                    dist.group.WORLD is group
                ), "the process group is not the one of the whole run"
            else:
                if dist.is_initialized():
                    dist.destroy_process_group()
                dist.init_process_group(
                    group_backend(args),
                    store=dist.PrefixStore(f"pg/{plan.generation}", store),
                    rank=rank,
                    world_size=world_size,
                    timeout=datetime.timedelta(seconds=args.timeout),
                )
                store_op(store.add, f"inits/{uid}", 1)
            ddp._update_process_group(
                dist.group.WORLD, sync_module_states=True, src=src
            )
            # On the CPU: CUDA tensors would be unpickled onto the sender's GPU.
            state = [
                tree_map(
                    lambda x: x.cpu() if isinstance(x, torch.Tensor) else x,
                    optimizer.state_dict(),
                )
            ]
            dist.broadcast_object_list(state, src=src)
            optimizer.load_state_dict(state[0])
            optimizer.zero_grad(set_to_none=True)
            _, stop_after = gather_with_stop(store, plan.generation, world_size, None)
            while step < args.steps:
                if stop_after >= 0 and step > stop_after:
                    store_op(store.add, f"gen/{plan.generation}/stopped", 1)
                    break
                inputs, targets = (t.to(device) for t in batch(step, rank))
                if kill == (step, "backward"):
                    # The embedding's gradient comes last, after the other buckets' allreduces started.
                    model.embed.weight.register_hook(
                        lambda grad: os.kill(os.getpid(), signal.SIGKILL)
                    )
                if kill == (step, "forward"):
                    os.kill(os.getpid(), signal.SIGKILL)
                loss = loss_fn(compiled(inputs).flatten(0, 1), targets.flatten())
                loss.backward()
                if device.type == "cuda":
                    wait_for_gpu(args.timeout / 2)
                if kill == (step, "optimizer"):
                    os.kill(os.getpid(), signal.SIGKILL)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                time.sleep(args.step_time)
                # Completed: what the next generation goes on from, if this one fails now.
                store_op(store.set, f"done/{uid}", str(step + 1))
                digests, stop_after = gather_with_stop(
                    store, plan.generation, world_size, digest(model)
                )
                if len(set(digests)) != 1:
                    store_op(store.add, f"diverged/{uid}", 1)
                    print(
                        f"[worker {uid}] error: parameters differ at step {step}: {digests}",
                        flush=True,
                    )
                    return 1
                if compiled_graphs() != graphs:
                    store_op(store.add, f"recompiles/{uid}", compiled_graphs() - graphs)
                    print(
                        f"[worker {uid}] error: recompiled at step {step}", flush=True
                    )
                    return 1
                if rank == 0:
                    print(
                        f"step {step:3d}  generation {plan.generation}  members {plan.members}  "
                        f"loss {loss.item():.4f}  parameters {digests[0]} on all  recompiles 0",
                        flush=True,
                    )
                step += 1
            else:
                # Gloo's threads end here rather than in the interpreter's teardown, which
                # can run after a peer has closed its connections.
                dist.destroy_process_group()
                return 0
        except RuntimeError as e:
            # A collective failed: Gloo's error, the group's timeout, or wait_for_gpu().
            if "reconfigured in place" in str(e):
                raise  # DDP's refusal: this loop forgot _update_process_group, a bug, not a fault
            failure = str(e).splitlines()[0][:120]
        if failure is not None:
            # Here, out of the except clause, nothing holds the failed step's Work any more.
            print(
                f"[worker {uid}] a collective of step {step} failed: {failure}",
                flush=True,
            )
            if args.backend == "nccl":
                if dist.is_initialized():
                    try:
                        abort_nccl(dist.group.WORLD)
                    except Exception as abort_error:
                        # The next generation's group is new anyway.
                        print(
                            f"[worker {uid}] aborting the old group failed: {abort_error}",
                            flush=True,
                        )
            else:
                release_failed_group(ddp, uid, plan.generation, args.reconfigure)
            store_op(store.add, f"gen/{plan.generation}/failures", 1)
        generation = plan.generation + 1


def worker_main(args) -> int:
    try:
        return worker(args)
    except StoreGone as e:
        print(
            f"[worker {args.uid}] error: the store at {args.host}:{args.port} is gone ({e}); exiting",
            flush=True,
        )
        return EXIT_STORE_GONE
    except NotAdmitted as e:
        print(f"[worker {args.uid}] error: cannot rejoin: {e}; exiting", flush=True)
        return EXIT_NOT_ADMITTED


# The launcher


class Hosts:
    """One Linux network namespace per worker, each with its own address on a veth bridge.

    Traffic between the workers and to the store, which listens on the bridge, stays on the
    bridge. Cutting a host sets its veth link down, as if its cable were pulled.
    """

    BRIDGE = "ddpbr0"
    PREFIX = "10.57.0"

    def __init__(self):
        if os.geteuid() != 0 or shutil.which("ip") is None:
            raise SystemExit("--netns needs root and iproute2 (ip)")
        self.hosts: List[int] = []
        self.ip("link", "add", self.BRIDGE, "type", "bridge")
        self.ip("addr", "add", f"{self.store_address}/24", "dev", self.BRIDGE)
        self.ip("link", "set", self.BRIDGE, "up")

    @property
    def store_address(self) -> str:
        return f"{self.PREFIX}.254"

    @staticmethod
    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    def add(self, uid: int) -> List[str]:
        """Creates host ``uid``; returns the command prefix that runs a process on it."""
        ns, veth = f"ddp-h{uid}", f"ddpv{uid}"
        self.ip("netns", "add", ns)
        self.hosts.append(uid)
        self.ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}i")
        self.ip("link", "set", f"{veth}i", "netns", ns)
        self.ip("link", "set", veth, "master", self.BRIDGE)
        self.ip("link", "set", veth, "up")
        self.ip("-n", ns, "link", "set", f"{veth}i", "name", "eth0")
        self.ip("-n", ns, "addr", "add", f"{self.PREFIX}.{uid + 1}/24", "dev", "eth0")
        self.ip("-n", ns, "link", "set", "eth0", "up")
        self.ip("-n", ns, "link", "set", "lo", "up")
        return ["ip", "netns", "exec", ns, "env", "GLOO_SOCKET_IFNAME=eth0"]

    def cut(self, uid: int) -> None:
        self.ip("link", "set", f"ddpv{uid}", "down")

    def remove(self) -> None:
        for uid in self.hosts:
            subprocess.run(["ip", "netns", "del", f"ddp-h{uid}"], capture_output=True)
            # Where the namespace outlives its deletion (a process still in it, or a kernel
            # that frees it later), so would the veth pair; deleting one end deletes both.
            subprocess.run(["ip", "link", "del", f"ddpv{uid}"], capture_output=True)
        subprocess.run(["ip", "link", "del", self.BRIDGE], capture_output=True)


class Launcher:
    def __init__(self, args):
        self.args = args
        self.hosts = Hosts() if args.netns else None
        if self.hosts:
            args.host = self.hosts.store_address
        self.store = dist.TCPStore(args.host, 0, is_master=True, wait_for_workers=False)
        self.port = self.store.port
        self.procs: Dict[int, subprocess.Popen] = {}
        self.gpus: Dict[int, int] = {}  # with --backend nccl, each worker's GPU
        self.next_uid = 0
        self.joined = 0  # join/N entries taken in
        # Steps after which to start a new worker, in order.
        self.rejoins: List[int] = [args.rejoin] if args.rejoin is not None else []
        self.generation = 0
        self.members: List[int] = []
        self.summary: List[str] = []
        self.killed = {int(spec.split(":")[0]) for spec in args.kill}
        self.faults = 0
        self.steps_lost = 0
        self.cut: set = (
            set()
        )  # hosts cut off, whose workers exit when they lose the store

    def start_worker(self) -> int:
        uid, self.next_uid = self.next_uid, self.next_uid + 1
        cmd = [
            sys.executable,
            __file__,
            *sys.argv[1:],
            "--worker",
            str(uid),
            "--port",
            str(self.port),
        ]
        cmd += ["--host", self.args.host]
        env = dict(os.environ)
        if self.args.backend == "nccl":
            # A GPU that no live worker holds: NCCL takes one per rank.
            held = {self.gpus[u] for u, p in self.procs.items() if p.poll() is None}
            free = [g for g in range(torch.cuda.device_count()) if g not in held]
            if not free:
                raise SystemExit(
                    f"[launcher] error: worker {uid} needs a GPU of its own, and live workers hold all {len(held)}"
                )
            self.gpus[uid] = free[0]
            cmd += ["--gpu", str(free[0])]
            env = {**nccl_error_handling_off(), **env}  # the user's settings win
        if self.hosts:
            cmd = self.hosts.add(uid) + cmd
        self.procs[uid] = subprocess.Popen(cmd, env=env)
        return uid

    def done(self, uid: int) -> int:
        """The last step that worker ``uid`` completed, -1 for none."""
        return counter(self.store, f"done/{uid}") - 1

    def progress(self) -> int:
        """The last step that a member completed, -1 for none."""
        return max([self.done(u) for u in self.members] + [-1])

    def finished(self) -> bool:
        return self.progress() >= self.args.steps - 1

    def alive(self, uid: int) -> bool:
        return (
            time.time() * 1000 - counter(self.store, f"hb/{uid}") < 4000 * HEARTBEAT_S
        )

    def joiners(self) -> List[int]:
        count = counter(self.store, "join/n")
        found = [
            int(self.store.get(f"join/{i}")) for i in range(self.joined + 1, count + 1)
        ]
        self.joined = count
        return found

    def unregistered(self) -> List[int]:
        """The workers started but not registered yet, whether or not taken in since."""
        count = counter(self.store, "join/n")
        registered = {int(self.store.get(f"join/{i}")) for i in range(1, count + 1)}
        return [u for u in self.procs if u not in registered]

    def holds_last_step(self) -> bool:
        """With --wait-for-joiners, whether the members must wait before the last step: a
        new worker is still to start (at a step the members reach before it) or to register.
        """
        last = self.args.steps - 1
        return self.args.wait_for_joiners and (
            any(step < last for step in self.rejoins) or bool(self.unregistered())
        )

    def publish(self, members: List[int], reason: str) -> None:
        completed = {u: self.done(u) for u in members}
        src = max(members, key=lambda u: (completed[u], -members.index(u)))
        step = completed[src] + 1
        if self.generation:
            # Every step that a member of the last generation completed is kept.
            self.steps_lost += max(
                0, max(self.done(u) for u in self.members) + 1 - step
            )
            self.faults += reason.startswith("lost")
        self.generation += 1
        plan = Plan(self.generation, members, src, step)
        self.store.set(f"gen/{self.generation}/plan", plan.dump())
        if self.holds_last_step():
            # Before the members can start: they stop once step `last - 1` is done.
            self.store.set(
                f"gen/{self.generation}/stop_after", str(self.args.steps - 1)
            )
        self.store.add("gen/current", 1)
        self.members = members
        line = f"generation {self.generation}: {reason}; members {members}, state from {src}, from step {step}"
        self.summary.append(line)
        print(f"[launcher] {line}", flush=True)

    def run(self) -> int:
        args = self.args
        for _ in range(args.workers):
            self.start_worker()
        deadline = time.monotonic() + args.join_timeout
        first: List[int] = []
        while len(first) < args.workers:
            first += self.joiners()
            if time.monotonic() > deadline:
                print(
                    "[launcher] error: the workers did not register in time", flush=True
                )
                return 1
            time.sleep(0.1)
        self.publish(sorted(first), "start")
        # Rejoins to start (at a step), and chaos kills to make (at a step, after a delay).
        rejoins = self.rejoins
        rng = random.Random(args.seed)
        kills = sorted(
            rng.sample(
                range(2, max(3, args.steps - 6)),
                k=min(args.chaos, max(1, args.steps - 8)),
            )
        )
        kills = [(step, rng.uniform(0.0, 0.5)) for step in kills[: args.chaos]]
        cuts = sorted(
            (tuple(int(x) for x in spec.split(":")) for spec in args.cut),
            key=lambda c: c[1],
        )
        while any(p.poll() is None for p in self.procs.values()):
            time.sleep(0.2)
            gen = self.generation
            progress = self.progress()
            if self.failures(gen):
                # Wait until every worker that is alive has left its failed collectives,
                # which a group's timeout bounds.
                deadline = time.monotonic() + 2 * args.timeout + 4 * HEARTBEAT_S
                time.sleep(4 * HEARTBEAT_S)
                survivors = [u for u in self.members if self.alive(u)]
                while (
                    self.failures(gen) < len(survivors) and time.monotonic() < deadline
                ):
                    time.sleep(0.1)
                    survivors = [u for u in self.members if self.alive(u)]
                lost = [u for u in self.members if u not in survivors]
                joining = self.joiners()
                if not survivors and not joining:
                    print(
                        f"[launcher] error: no worker of generation {gen} survived",
                        flush=True,
                    )
                    return 1
                self.publish(survivors + joining, f"lost {lost}")
                continue
            if args.wait_for_joiners and not self.finished():
                gone = [
                    u for u in self.unregistered() if self.procs[u].poll() is not None
                ]
                if gone:
                    # Else the members would wait for it before the last step until they
                    # give up on the plan (--join-timeout).
                    print(
                        f"[launcher] error: worker {gone[0]} exited before it registered",
                        flush=True,
                    )
                    return 1
            if rejoins and progress >= rejoins[0]:
                # Also once training has finished, when the new worker must exit as not admitted.
                rejoins.pop(0)
                self.start_worker()
            if self.finished():
                self.store.add("finished", 1)
                continue
            if args.stop_store_at is not None and progress >= args.stop_store_at:
                return self.stop_store()
            if cuts and progress >= cuts[0][1]:
                uid = cuts.pop(0)[0]
                assert self.hosts is not None
                self.hosts.cut(uid)
                self.cut.add(uid)
                print(
                    f"[launcher] cut host {uid} off the network after step {progress}",
                    flush=True,
                )
            if kills and progress >= kills[0][0] and len(self.members) > 1:
                # A SIGKILL from outside, at whatever point the victim is.
                step, delay = kills.pop(0)
                time.sleep(delay)
                victim = rng.choice(self.members)
                os.kill(self.procs[victim].pid, signal.SIGKILL)
                self.killed.add(victim)
                print(
                    f"[launcher] chaos: SIGKILL worker {victim} after step {progress}",
                    flush=True,
                )
                bisect.insort(rejoins, progress + rng.randint(2, 4))
            if counter(self.store, "join/n") > self.joined:
                # A new worker registered, compiled: the members stop at a step boundary
                # two steps on, or at the first one after it where they read the stop late
                # (they agree on the earliest any of them read: gather_with_stop), unless
                # training ends first; then the new worker is not admitted. A boundary
                # already set (--wait-for-joiners) stays if it comes first.
                held = counter(self.store, f"gen/{gen}/stop_after")
                stop_after = progress + 2 + 1
                self.store.set(
                    f"gen/{gen}/stop_after", str(min(stop_after, held or stop_after))
                )
                while counter(self.store, f"gen/{gen}/stopped") < len(self.members):
                    if self.failures(gen) or self.finished():
                        break
                    time.sleep(0.1)
                else:
                    self.publish(self.members + self.joiners(), "grow")
        codes = {u: p.wait() for u, p in self.procs.items()}
        final = self.progress()
        recompiles = sum(counter(self.store, f"recompiles/{u}") for u in self.procs)
        diverged = sum(counter(self.store, f"diverged/{u}") for u in self.procs)
        print("[launcher] " + "\n[launcher] ".join(self.summary), flush=True)
        inits = {u: counter(self.store, f"inits/{u}") for u in self.procs}
        print(
            f"[launcher] process groups initialized by each worker: {inits}", flush=True
        )
        print(
            f"[launcher] faults survived {self.faults}, steps lost {self.steps_lost}, recompiles "
            f"{recompiles}, parameter divergences {diverged}; last step completed {final} of "
            f"{args.steps - 1}; exit codes {codes}",
            flush=True,
        )
        # A worker that was never a member when training finished was not admitted: exit 3.
        ever = set().union(
            *(
                set(Plan.load(self.store.get(f"gen/{g}/plan")).members)
                for g in range(1, self.generation + 1)
            )
        )
        ok = (
            final == args.steps - 1
            and self.steps_lost == recompiles == diverged == 0
            and all(c == EXIT_STORE_GONE for u, c in codes.items() if u in self.cut)
            and all(
                c == (0 if u in ever else EXIT_NOT_ADMITTED)
                for u, c in codes.items()
                if u not in self.killed | self.cut
            )
        )
        return 0 if ok else 1

    def stop_store(self) -> int:
        """Shuts the store down under the workers, who must exit with a clear error."""
        print(
            f"[launcher] shutting the store down after step {self.done(self.members[0])}",
            flush=True,
        )
        del self.store
        codes = {u: p.wait() for u, p in self.procs.items()}
        print(f"[launcher] exit codes {codes}", flush=True)
        return 0 if all(c == EXIT_STORE_GONE for c in codes.values()) else 1

    def failures(self, generation: int) -> int:
        return counter(self.store, f"gen/{generation}/failures")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument(
        "--kill",
        action="append",
        default=[],
        metavar="UID:STEP:PHASE",
        help="worker UID SIGKILLs itself at STEP: as its forward pass starts, in its backward "
        "pass, or before its optimizer step (PHASE forward, backward or optimizer)",
    )
    parser.add_argument(
        "--rejoin",
        type=int,
        metavar="STEP",
        help="start a new worker once STEP is completed",
    )
    parser.add_argument(
        "--chaos",
        type=int,
        default=0,
        metavar="N",
        help="the launcher SIGKILLs N random members at random times, and starts a new worker "
        "a few steps after each",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of --chaos")
    parser.add_argument(
        "--step-time",
        type=float,
        default=0.2,
        help="seconds each step takes on top of its compute, so that new workers, which "
        "start and compile meanwhile, find training still going (default: 0.2)",
    )
    parser.add_argument(
        "--wait-for-joiners",
        action="store_true",
        help="the members wait before the last step, for up to --join-timeout, until every "
        "new worker due before it (--rejoin, --chaos) has started and been taken in, however "
        "long it takes to start and compile",
    )
    parser.add_argument(
        "--backend",
        choices=("gloo", "nccl"),
        default="gloo",
        help="what DDP reduces over: gloo on CPU, or nccl with a GPU for each worker "
        "(default: gloo)",
    )
    parser.add_argument(
        "--reconfigure",
        action="store_true",
        help="keep one process group for the whole run, and reconfigure it in place for "
        "each generation (Gloo; torch 2.14 or later)",
    )
    parser.add_argument(
        "--compile-backend",
        default="inductor",
        help="torch.compile backend (default: inductor)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="the process groups' timeout, seconds",
    )
    parser.add_argument(
        "--join-timeout",
        type=float,
        default=300.0,
        help="how long a worker waits to be admitted",
    )
    parser.add_argument(
        "--stop-store-at",
        type=int,
        metavar="STEP",
        help="shut the store down once STEP is completed; every worker must then exit with "
        f"code {EXIT_STORE_GONE}",
    )
    parser.add_argument(
        "--netns",
        action="store_true",
        help="run every worker on a host of its own: a network namespace on a veth bridge "
        "(needs root and iproute2)",
    )
    parser.add_argument(
        "--cut",
        action="append",
        default=[],
        metavar="UID:STEP",
        help="with --netns, cut worker UID's host off the network after STEP",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--worker", dest="uid", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--gpu", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reconfigure and (
        args.backend != "gloo" or not hasattr(dist, "_reconfigure")
    ):
        parser.error(
            f"--reconfigure needs --backend gloo and a torch with torch.distributed._reconfigure "
            f"(2.14 or later); this is --backend {args.backend} on torch {torch.__version__}"
        )
    if args.backend == "nccl" and torch.cuda.device_count() < args.workers:
        parser.error(
            f"--backend nccl needs a GPU for each of the {args.workers} workers; "
            f"{torch.cuda.device_count()} are visible"
        )
    for spec in args.kill:
        parts = spec.split(":")
        if (
            len(parts) != 3
            or parts[2] not in PHASES
            or not all(p.isdigit() for p in parts[:2])
        ):
            parser.error(
                f"--kill {spec!r}: expected UID:STEP:PHASE with PHASE one of {', '.join(PHASES)}"
            )
    for spec in args.cut:
        if not args.netns or not re.fullmatch(r"\d+:\d+", spec):
            parser.error(f"--cut {spec!r}: expected UID:STEP, with --netns")
    if args.uid is not None:
        return worker_main(args)
    launcher = Launcher(args)
    try:
        return launcher.run()
    finally:
        for proc in launcher.procs.values():
            if proc.poll() is None:
                proc.kill()
        if launcher.hosts:
            launcher.hosts.remove()


if __name__ == "__main__":
    sys.exit(main())
