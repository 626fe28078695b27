"""Recovery after a lost rank: DDP following its group, against torchft 0.2.0 and a restart.

For each world size, model size and compile mode, a driver starts one process per replica
(Gloo on CPU, a TCPStore the driver hosts), trains the transformer of
resume_after_membership_change.py with Adam, SIGKILLs the last replica at step --kill-step,
and starts a new process in its place once the survivors have completed --join-after further
steps. The kill comes inside the replica's backward pass, or between steps (--kill-in; both by
default). Paths:

  a_reconfigure  every process keeps one group for the whole run and reconfigures it in
                 place (dist._reconfigure); DDP follows with _update_process_group()
  a              destroy and init the default group, then _update_process_group()
  torchft        torchft's Manager, its DistributedDataParallel and its reconfigurable Gloo
                 group, with a lighthouse the driver starts (its timeouts are reported)
  c              a restart of every process, as TorchElastic does: from a checkpoint written
                 after every step, on the loss and again on the join

How a joining process is admitted: in a and a_reconfigure it builds, wraps and compiles its
model and runs a step on a group of its own (the warm-up), then the driver admits it, and the
first survivor chooses the next step boundary, which no member can have passed yet. The call
broadcasts the parameters and buffers from a member (sync_module_states=True), and a member
broadcasts Adam's state; in torchft the joiner heals from
a member through torchft's checkpoint transport inside its first quorum (use_async_quorum=False);
in c every process loads the checkpoint. Detection differs: in a and a_reconfigure the driver,
the processes' parent, sees the exit at once and publishes the survivors (an oracle, a lower
bound on detection); torchft's lighthouse forms the next quorum once the lost replica's heartbeat
expires, or sooner, once a majority has asked and its join timeout has passed.

Reported per path: the time from the kill to the survivors' next completed optimizer step; from
the new process's start to its first completed step; the failed attempts (steps whose update
was discarded and done again), the updates lost for good, and the steps short of a member
(whose update averaged fewer replicas' gradients than the run had members); whether every process's
parameters and Adam state at the end equal those of a reference run, path a replayed with the
same membership schedule and no fault (bitwise, else the largest difference of a parameter);
the graphs compiled after each process's warm-up; the peak RSS of a step during recovery over
the steady state's; the steady step time.

Then, for the same configurations, with no fault: the steady step of stock DDP against the
series (stock in processes that load the wheel's original Python files; interleaved, repeated,
a 95% interval of the ratio and a verdict against GOALS), torchft's beside them; and the cost
of the _update_process_group call against the collectives it makes, each timed alone on the
same group with the same payloads.

Writes a table to stdout, recovery_after_lost_rank.json to --out, a file that every
measurement updates, so that a run that stops can go on (--paths, --kill-in, --worlds, --sizes,
--compile and --skip choose what runs), and a plot of the file, recovery_after_lost_rank.png.
Needs torch 2.14 with the series (the overlay venv of v2.14.1) and torchft 0.2.0.
"""

import argparse
import dataclasses
import datetime
import hashlib
import importlib.metadata
import importlib.util
import itertools
import json
import math
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "examples")]
import stock_torch  # noqa: E402 (imports no torch)

if __name__ == "__main__" and sys.flags.no_site:
    # The driver starts stock processes with python -S: the wheel's own files, before torch.
    stock_torch.use_stock_files()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from elastic_ddp import reconfigure, SOLO_UUID  # noqa: E402
from resume_after_membership_change import (  # noqa: E402
    compiled_graphs,
    LanguageModel,
    peak_rss_mb,
    reset_peak_rss,
    SEQUENCE,
    SIZES,
    VOCAB,
)
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

PATHS = ("a_reconfigure", "a", "torchft", "c")
KILL_IN = ("backward", "between_steps")
CALL_MODES = (
    "no_sync",
    "sync",
)  # _update_process_group(sync_module_states=False), then True
GOALS = {
    "steady_over_stock": 1.02,  # the series' steady step over stock DDP's
    "call_over_collectives": 1.5,  # the _update_process_group call over its collectives, timed alone
}
# The generations of a run: everyone, the survivors, everyone again with the new process.
FIRST, SURVIVORS, REJOINED = 1, 2, 3
BATCH = 4
# What bounds a run before the plan of its last generation says where it ends.
MAX_STEPS = 100000


# The processes


class Events:
    """One JSON line per event, appended with os.write, so that a SIGKILL loses nothing written.

    Times are time.monotonic_ns(), one clock for every process of the machine.
    """

    def __init__(self, directory: str, slot: int):
        self.slot = slot
        name = os.path.join(directory, f"{slot}-{os.getpid()}.jsonl")
        self.fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def log(self, kind: str, **fields) -> None:
        record = {
            "kind": kind,
            "t": time.monotonic_ns(),
            "slot": self.slot,
            "pid": os.getpid(),
            **fields,
        }
        os.write(self.fd, (json.dumps(record) + "\n").encode())


def read_events(directory: str) -> List[dict]:
    found = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".jsonl"):
            with open(os.path.join(directory, name)) as f:
                found += [json.loads(line) for line in f if line.endswith("\n")]
    return sorted(found, key=lambda e: e["t"])


def batch(step: int, slot: int):
    """The tokens of ``slot`` at ``step``: a new process in a lost one's slot trains on its data."""
    gen = torch.Generator().manual_seed(1000 * step + slot)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQUENCE + 1), generator=gen)
    return tokens[:, :-1], tokens[:, 1:]


def state_digest(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """Of the parameters and Adam's state, bit for bit."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
        for value in optimizer.state.get(p, {}).values():
            h.update(
                value.numpy().tobytes()
                if isinstance(value, torch.Tensor)
                else repr(value).encode()
            )
    return h.hexdigest()[:16]


class Process:
    """What every process of the benchmark has: its event log, the driver's store, and the
    model (seeded alike in every process), Adam and the loss."""

    def __init__(self, args):
        self.args, self.slot = args, args.slot
        self.events = Events(args.events, args.slot)
        self.store = dist.TCPStore(
            args.host,
            args.port,
            is_master=False,
            timeout=datetime.timedelta(seconds=args.timeout),
        )
        # The user's OMP_NUM_THREADS wins; else the cores shared among the processes.
        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.world))
        torch.manual_seed(0)
        self.model = LanguageModel(SIZES[args.size])
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.loss_fn = nn.CrossEntropyLoss()

    def compiled(self, ddp: nn.Module) -> nn.Module:
        return torch.compile(ddp) if self.args.compile == "inductor" else ddp

    def die_if_due(self, step: int) -> None:
        """Where ``step`` is the kill's, and the kill comes between steps: the process dies
        before it starts the step, after it completed the one before on every replica.
        """
        if self.args.kill_step == step and self.args.kill_in == "between_steps":
            self.die(step)

    def backward(self, net: nn.Module, step: int) -> None:
        """The forward and backward pass of ``step``; where it is the kill's, and the kill comes
        in the backward pass, the process dies in it."""
        if self.args.kill_step == step and self.args.kill_in == "backward":
            # The embedding's gradient comes last, after the other buckets' allreduces started.
            self.model.embed.weight.register_hook(lambda grad: self.die(step))
        inputs, targets = batch(step, self.slot)
        self.loss_fn(net(inputs).flatten(0, 1), targets.flatten()).backward()

    def train_step(self, net: nn.Module, step: int) -> None:
        self.backward(net, step)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def init_whole_group(self, prefix: str) -> None:
        """The default group of every process the driver started, ranked by slot."""
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(prefix, self.store),
            rank=self.slot,
            world_size=self.args.world,
        )

    def die(self, step: int) -> None:
        self.events.log("kill", step=step)
        os.kill(os.getpid(), signal.SIGKILL)

    def finish(self, step: int, graphs_after_warmup: int) -> None:
        """Logs the state at the end, and saves the parameters, for the comparison with the reference."""
        self.events.log(
            "final",
            step=step,
            digest=state_digest(self.model, self.optimizer),
            graphs_after_warmup=graphs_after_warmup,
        )
        parameters = [p.detach() for p in self.model.parameters()]
        torch.save(parameters, os.path.join(self.args.events, f"final-{self.slot}.pt"))


class Replica(Process):
    """A process of paths a, a_reconfigure and c, and of the reference runs (path a, no fault)."""

    def __init__(self, args):
        super().__init__(args)
        self.step = 0
        self.end = args.steps  # until a generation's plan says where the run ends

    def wrap(self) -> None:
        self.ddp = DistributedDataParallel(self.model)
        self.net = self.compiled(self.ddp)

    def plan(self, generation: int) -> dict:
        return json.loads(self.store.get(f"plan/{generation}"))

    def checkpoint(self) -> None:
        tmp = self.args.checkpoint + ".tmp"
        torch.save(
            {
                "step": self.step,
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
            },
            tmp,
        )
        os.replace(tmp, self.args.checkpoint)

    def run(self) -> int:
        generation = self.args.first_generation
        if self.args.restarted:
            # Path c: a process of a restart, from the checkpoint.
            checkpoint = torch.load(self.args.checkpoint)
            self.model.load_state_dict(checkpoint["model"])
            self.optimizer.load_state_dict(checkpoint["optimizer"])
            self.step = checkpoint["step"]
            plan = self.plan(generation)
            self.end = plan.get("end", self.end)
            self.init_group(plan, generation)
            self.wrap()
            graphs = 0
        else:
            self.init_solo_group()
            self.wrap()
            self.backward(self.net, 0)
            self.optimizer.zero_grad(set_to_none=True)
            graphs = compiled_graphs()
            self.events.log("ready", graphs=graphs)
            plan = None
        while True:
            if plan is None:
                plan = self.plan(generation)
                if self.slot not in plan["members"]:
                    self.events.log("left", step=self.step)
                    return 0
                self.enter(plan, generation)
            switch_key, admit_key = f"switch/{generation}", f"admit/{generation}"
            chooses = plan["members"][0] == self.slot and not self.args.restarted
            try:
                while self.step < self.end:
                    if chooses and self.store.check([admit_key]):
                        # The next boundary: no member has passed it, since none can complete this
                        # step before this process starts it, after the switch is set.
                        self.store.set(switch_key, str(self.step + 1))
                        chooses = False
                    if self.store.check([switch_key]):
                        switch_at = int(self.store.get(switch_key))
                        if switch_at < self.step:
                            raise SystemExit(
                                f"slot {self.slot} saw the switch at step {switch_at} at {self.step}"
                            )
                        if switch_at == self.step:
                            break
                    self.die_if_due(self.step)
                    reset_peak_rss()
                    self.events.log("attempt", step=self.step)
                    self.train_step(self.net, self.step)
                    self.step += 1
                    # Before the checkpoint: a step completed and not saved is done again, which
                    # the analysis counts as discarded; one saved and not logged would count so too.
                    self.events.log(
                        "step",
                        step=self.step - 1,
                        generation=generation,
                        rss_mb=peak_rss_mb(),
                    )
                    if self.args.path == "c" and plan["members"][0] == self.slot:
                        self.checkpoint()
                else:
                    break
            except RuntimeError as e:
                # A collective failed: the lost replica's peer closed its connections.
                self.events.log(
                    "failed", step=self.step, error=str(e).splitlines()[0][:200]
                )
                self.optimizer.zero_grad(set_to_none=True)
            generation += 1
            plan = None
        self.finish(self.step, compiled_graphs() - graphs)
        dist.destroy_process_group()
        return 0

    def init_solo_group(self) -> None:
        timeout = datetime.timedelta(seconds=self.args.collective_timeout)
        if self.args.path == "a_reconfigure":
            # One group for the whole run; its rank names this process in its handles.
            dist.init_process_group(
                "gloo",
                store=dist.PrefixStore("pg", self.store),
                rank=self.slot,
                world_size=self.slot + 1,
                timeout=timeout,
                enable_reconfigure=True,
            )
            self.reconfigure([self.slot], SOLO_UUID + self.slot)
        else:
            dist.init_process_group(
                "gloo",
                store=dist.PrefixStore(f"solo/{self.slot}/{os.getpid()}", self.store),
                rank=0,
                world_size=1,
            )

    def reconfigure(self, members: List[int], uuid: int) -> None:
        reconfigure(self.store, self.slot, members, uuid, self.args.collective_timeout)

    def init_group(self, plan: dict, generation: int) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        prefix = f"pg/{generation}/{plan.get('restart', 0)}"
        # Every member arrives before any connects. Gloo's rendezvous waits only as long as the
        # group's timeout, and a survivor that is not the lost rank's neighbor arrives only when
        # its collective times out: as late, after the kill, as the others' rendezvous ends.
        self.store.set(f"{prefix}/arrived/{self.slot}", "1")
        self.store.wait([f"{prefix}/arrived/{slot}" for slot in plan["members"]])
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(prefix, self.store),
            rank=plan["members"].index(self.slot),
            world_size=len(plan["members"]),
            timeout=datetime.timedelta(seconds=self.args.collective_timeout),
        )

    def enter(self, plan: dict, generation: int) -> None:
        """Joins generation ``plan``: the group, DDP, and Adam's state where a process joins."""
        if self.args.path == "a_reconfigure":
            self.reconfigure(plan["members"], generation)
        else:
            self.init_group(plan, generation)
        src = plan["members"].index(plan["src"])
        self.ddp._update_process_group(
            dist.group.WORLD, sync_module_states=True, src=src
        )
        if plan["joiners"]:
            state = [self.optimizer.state_dict()]
            dist.broadcast_object_list(state, src=src)
            self.optimizer.load_state_dict(state[0])
            self.optimizer.zero_grad(set_to_none=True)
            self.step = int(self.store.get(f"switch/{generation - 1}"))
            self.end = self.step + plan["steps_after_join"]
        self.events.log(
            "entered", generation=generation, members=plan["members"], step=self.step
        )


def torchft_replica(args) -> int:
    """A process of path torchft: a replica group of one process, as in torchft's examples."""
    from torchft import Manager
    from torchft.ddp import DistributedDataParallel as FtDistributedDataParallel
    from torchft.process_group import ProcessGroupGloo as FtProcessGroupGloo

    process = Process(args)
    model, optimizer, events, store = (
        process.model,
        process.optimizer,
        process.events,
        process.store,
    )
    timeout = datetime.timedelta(seconds=args.timeout)
    replica_store = dist.TCPStore(
        "localhost", 0, is_master=True, wait_for_workers=False, timeout=timeout
    )

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    manager = Manager(
        pg=FtProcessGroupGloo(
            timeout=datetime.timedelta(seconds=args.collective_timeout)
        ),
        min_replica_size=args.world - 1,
        load_state_dict=load_state_dict,
        state_dict=lambda: {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
        },
        replica_id=f"replica_{args.slot}",  # torchft adds a uuid; its rank comes from these digits
        store_addr="localhost",
        store_port=replica_store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=args.lighthouse,
        port=0,
        use_async_quorum=False,
        init_sync=False,
        timeout=timeout,
        quorum_timeout=timeout,
        connect_timeout=timeout,
    )
    net = process.compiled(FtDistributedDataParallel(manager, model))
    events.log("ready", graphs=0)
    if not args.restarted:
        # Every first replica asks for the first quorum together, so that it has them all.
        store.add("torchft/ready", 1)
        while int(store.add("torchft/ready", 0)) < args.world:
            time.sleep(0.01)
    warm = None
    end = (
        args.steps
    )  # until the driver says where the run ends, once the new process is in
    while manager.current_step() < end:
        step = manager.current_step()
        if store.check(["end"]):
            end = int(store.get("end"))
            if step > end:
                raise SystemExit(
                    f"slot {args.slot} is at step {step}, past the end at {end}"
                )
            if step == end:
                break
        process.die_if_due(step)
        reset_peak_rss()
        manager.start_quorum()
        # A new process heals inside its first quorum: from there on, its step is the members'.
        step = manager.current_step()
        optimizer.zero_grad(set_to_none=True)
        events.log("attempt", step=step)
        try:
            process.backward(net, step)
        except AssertionError as e:
            # torchft 0.2.0: where the allreduce in its comm hook fails, the manager records the
            # error, and then the hook's `assert fut._fut` fails (torchft/ddp.py), out of the
            # backward pass. Caught here, the step is not committed, as torchft intends.
            events.log("backward_raised", step=step, error=f"AssertionError: {e}")
        if manager.should_commit():
            optimizer.step()
            if warm is None and not args.restarted:
                warm = compiled_graphs()  # the first step compiles
            events.log(
                "step",
                step=step,
                participants=manager.num_participants(),
                rss_mb=peak_rss_mb(),
            )
        else:
            events.log("failed", step=step)
    process.finish(manager.current_step(), compiled_graphs() - (warm or 0))
    manager.shutdown(wait=False)
    return 0


# The driver


class RunFailed(Exception):
    pass


@dataclasses.dataclass
class Cell:
    world: int
    size: str
    compile: str
    path: str
    kill_in: str = "backward"

    @property
    def key(self) -> str:
        return f"w{self.world}-{self.size}-{self.compile}-{self.kill_in}-{self.path}"


class Driver:
    """Runs one cell, with the fault (``reference=None``) or as the replay of a schedule."""

    def __init__(
        self,
        args,
        cell: Cell,
        workdir: str,
        reference: Optional[dict] = None,
        steady: Optional[int] = None,
    ):
        # steady: path torchft for that many steps, with no fault.
        self.args, self.cell, self.reference, self.steady = (
            args,
            cell,
            reference,
            steady,
        )
        self.events_dir = os.path.join(workdir, "events")
        os.makedirs(self.events_dir)
        self.checkpoint = os.path.join(workdir, "checkpoint.pt")
        self.store = dist.TCPStore(
            "localhost",
            0,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=args.timeout),
        )
        self.procs: Dict[int, subprocess.Popen] = {}  # by pid
        self.spawned: Dict[int, int] = {}  # pid -> monotonic_ns at its start
        self.lighthouse = None
        self.victim = cell.world - 1

    def spawn(
        self,
        slot: int,
        path: str,
        *,
        first_generation: int = FIRST,
        kill: bool = False,
        restarted: bool = False,
    ) -> int:
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--role",
            "torchft" if path == "torchft" else "replica",
        ]
        cmd += [
            "--slot",
            str(slot),
            "--world",
            str(self.cell.world),
            "--size",
            self.cell.size,
        ]
        cmd += [
            "--compile-mode",
            self.cell.compile,
            "--path",
            path,
            "--steps",
            str(self.steady or MAX_STEPS),
        ]
        cmd += [
            "--port",
            str(self.store.port),
            "--events",
            self.events_dir,
            "--timeout",
            str(self.args.timeout),
        ]
        cmd += [
            "--first-generation",
            str(first_generation),
            "--checkpoint",
            self.checkpoint,
        ]
        cmd += ["--collective-timeout", str(self.args.collective_timeout)]
        if kill:
            cmd += [
                "--kill-step-of-process",
                str(self.args.kill_step),
                "--kill-in-process",
                self.cell.kill_in,
            ]
        if restarted:
            cmd += ["--restarted"]
        if self.lighthouse is not None:
            cmd += ["--lighthouse", self.lighthouse.address()]
        env = dict(os.environ)
        if path == "torchft":
            # torchft's users run stock torch: its DDP subclasses stock DDP here.
            cmd[:1] = stock_torch.command(env)
        start = time.monotonic_ns()
        stderr = tempfile.NamedTemporaryFile("w", dir=self.events_dir, delete=False)
        proc = subprocess.Popen(cmd, env=env, stderr=stderr)
        stderr.close()
        os.rename(stderr.name, self.stderr_path(proc.pid))
        self.procs[proc.pid], self.spawned[proc.pid] = proc, start
        return proc.pid

    def publish(
        self,
        generation: int,
        members: List[int],
        joiners: List[int],
        restart: int = 0,
        end: Optional[int] = None,
    ) -> None:
        """The plan of ``generation``. Where it has joiners, its step is that of the switch to it, and
        it ends --steps-after-join steps later; else it ends at ``end`` (c), or goes on.
        """
        plan = {
            "members": members,
            "src": members[0],
            "joiners": joiners,
            "restart": restart,
            "steps_after_join": self.args.steps_after_join,
        }
        if end is not None:
            plan["end"] = end
        self.store.set(f"plan/{generation}", json.dumps(plan))

    def last_error(self, pid: int) -> str:
        """Process ``pid``'s exception, as it recorded it. Where it recorded none (a C++ abort),
        the last line of its stderr that names an error, else its last line."""
        recorded = recorded_error(self.events_dir, pid)
        if recorded is not None:
            return recorded[:300]
        with open(self.stderr_path(pid)) as f:
            lines = [line.strip() for line in f if line.strip()]
        errors = [
            line
            for line in lines
            if re.match(r"(\[rank\d+\]: )*[\w.]*(Error|Exception)\b", line)
        ]
        return (errors or lines or ["nothing on stderr"])[-1][:300]

    def stderr_path(self, pid: int) -> str:
        return os.path.join(self.events_dir, f"stderr-{pid}.txt")

    def events(self) -> List[dict]:
        return read_events(self.events_dir)

    def completed(self, slots) -> int:
        """The last step that every process of ``slots`` completed since the fault (-1 if none)."""
        last = {}
        for e in self.events():
            if e["kind"] == "step" and e["slot"] in slots:
                last[e["slot"]] = max(last.get(e["slot"], -1), e["step"])
        return min(last.get(s, -1) for s in slots)

    def wait(self, condition, what: str) -> None:
        deadline = time.monotonic() + self.args.timeout * 4
        while not condition():
            failed = {
                pid: p.returncode
                for pid, p in self.procs.items()
                if p.poll() not in (None, 0, -signal.SIGKILL)
            }
            if failed:
                pid, code = min(failed.items())
                raise RunFailed(
                    f"processes exited with {sorted(failed.values())} while waiting for {what}; "
                    f"one with {code}: {self.last_error(pid)}"
                )
            if time.monotonic() > deadline:
                raise RunFailed(f"timed out waiting for {what}")
            time.sleep(0.005)

    def run(self) -> List[dict]:
        try:
            if self.cell.path == "torchft":
                self.run_torchft()
            elif self.reference is not None:
                self.run_reference()
            else:
                self.run_with_fault()
            self.wait(
                lambda: all(p.poll() is not None for p in self.procs.values()),
                "the end of the run",
            )
            codes = {pid: p.returncode for pid, p in self.procs.items()}
            failed = sorted(
                pid for pid, code in codes.items() if code not in (0, -signal.SIGKILL)
            )
            if failed:
                raise RunFailed(
                    f"processes exited with {sorted(codes.values())}; one with {codes[failed[0]]}: "
                    f"{self.last_error(failed[0])}"
                )
            return self.events()
        finally:
            for p in self.procs.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
            if self.lighthouse is not None:
                self.lighthouse.shutdown()

    def run_reference(self) -> None:
        """Path a, with the membership schedule of a run: the lost slot leaves at its step, the
        new process joins at its; no process is killed."""
        everyone, survivors = list(range(self.cell.world)), list(
            range(self.cell.world - 1)
        )
        self.publish(FIRST, everyone, [])
        self.store.set(f"switch/{FIRST}", str(self.reference["left_at"]))
        self.publish(SURVIVORS, survivors, [])
        self.store.set(f"switch/{SURVIVORS}", str(self.reference["joined_at"]))
        self.publish(REJOINED, everyone, [self.victim])
        for slot in everyone:
            self.spawn(slot, "a")
        self.spawn(self.victim, "a", first_generation=REJOINED)

    def run_with_fault(self) -> None:
        path, everyone = self.cell.path, list(range(self.cell.world))
        survivors = everyone[:-1]
        first = {
            slot: self.spawn(slot, path, kill=slot == self.victim) for slot in everyone
        }
        self.publish(FIRST, everyone, [])
        self.wait(lambda: self.procs[first[self.victim]].poll() is not None, "the kill")
        if path == "c":
            # TorchElastic's agent stops the other workers and starts them all again.
            self.restart(survivors, SURVIVORS, restart=1)
        else:
            self.publish(SURVIVORS, survivors, [])
        self.wait(
            lambda: self.completed(survivors)
            >= self.args.kill_step + self.args.join_after,
            "the survivors",
        )
        if path == "c":
            self.restart(everyone, REJOINED, restart=2)
            return
        pid = self.spawn(self.victim, path, first_generation=REJOINED)
        self.wait(
            lambda: any(
                e["kind"] == "ready" and e["pid"] == pid for e in self.events()
            ),
            "the new process",
        )
        # The first survivor chooses the step of the switch (Replica.run).
        self.publish(REJOINED, everyone, [self.victim])
        self.store.set(f"admit/{SURVIVORS}", "1")

    def restart(self, slots: List[int], generation: int, restart: int) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        step = torch.load(self.checkpoint)["step"]
        end = step + self.args.steps_after_join if generation == REJOINED else None
        self.publish(generation, slots, [], restart=restart, end=end)
        for slot in slots:
            self.spawn(slot, "c", first_generation=generation, restarted=True)

    def run_torchft(self) -> None:
        from torchft._torchft import LighthouseServer

        self.lighthouse = LighthouseServer(
            bind="[::]:0",
            min_replicas=self.cell.world - 1,
            join_timeout_ms=self.args.lighthouse_join_timeout_ms,
            quorum_tick_ms=self.args.lighthouse_tick_ms,
            heartbeat_timeout_ms=self.args.lighthouse_heartbeat_timeout_ms,
        )
        everyone, survivors = list(range(self.cell.world)), list(
            range(self.cell.world - 1)
        )
        first = {
            slot: self.spawn(
                slot, "torchft", kill=slot == self.victim and not self.steady
            )
            for slot in everyone
        }
        if self.steady:
            return
        self.wait(lambda: self.procs[first[self.victim]].poll() is not None, "the kill")
        self.wait(
            lambda: self.completed(survivors)
            >= self.args.kill_step + self.args.join_after,
            "the survivors",
        )
        pid = self.spawn(self.victim, "torchft", restarted=True)
        # Its first step is everyone's: the run ends a fixed number of steps after it.
        self.wait(
            lambda: any(e["kind"] == "step" and e["pid"] == pid for e in self.events()),
            "the new process",
        )
        joined = next(
            e["step"] for e in self.events() if e["kind"] == "step" and e["pid"] == pid
        )
        self.store.set("end", str(joined + self.args.steps_after_join))


def analyze(events: List[dict], spawned: Dict[int, int], victim: int) -> dict:
    """What one run with the fault says: its times, discarded attempts, RSS, graphs and schedule."""
    kill = next(e for e in events if e["kind"] == "kill")
    completed = [e for e in events if e["kind"] == "step"]
    before = [e for e in completed if e["t"] < kill["t"]]
    # A survivor may still complete the step before the kill's after it: not a recovery.
    after = [e for e in completed if e["t"] > kill["t"] and e["step"] >= kill["step"]]
    survivors = sorted({e["slot"] for e in completed if e["slot"] != victim})
    # The survivors' next completed optimizer step: the last of them to complete one.
    recovered = max(next(e["t"] for e in after if e["slot"] == s) for s in survivors)
    first_join = next(e for e in after if e["slot"] == victim)
    # The steady step: slot 0's, from the second step on (the first compiles), up to the kill.
    slot0 = [e["t"] for e in before if e["slot"] == 0]
    step_times = [(b - a) / 1e9 for a, b in zip(slot0[1:], slot0[2:])]
    steady_rss = statistics.median(
        e["rss_mb"] for e in before if e["slot"] in survivors and e["step"] > 0
    )
    recovery_rss = max(
        e["rss_mb"]
        for e in after
        if e["slot"] in survivors and e["t"] <= first_join["t"]
    )
    # Discarded: a survivor's attempt that its process never completed, or a step that a slot
    # completed again after a restart from an older checkpoint. Lost: a step no replica completed.
    counts: Dict[tuple, int] = {}
    for e in events:
        if e["kind"] in ("attempt", "step") and e["slot"] != victim:
            key = (e["pid"], e["step"])
            counts[key] = counts.get(key, 0) + (1 if e["kind"] == "attempt" else -1)
    discarded = sum(counts.values())
    by_slot: Dict[tuple, int] = {}
    for e in completed:
        by_slot[(e["slot"], e["step"])] = by_slot.get((e["slot"], e["step"]), 0) + 1
    discarded += sum(n - 1 for (slot, _), n in by_slot.items() if slot != victim)
    finals = [e for e in events if e["kind"] == "final"]
    end = max(e["step"] for e in finals)
    # The first step trained without the lost replica: c's restart goes back to the last
    # checkpoint, which is before the kill's step where the kill came while it was written.
    left_at = min(
        (e["step"] for e in completed if e.get("generation") == SURVIVORS),
        default=kill["step"],
    )
    # Short: a step whose update averaged fewer replicas' gradients than the run had members
    # then. torchft logs how many it averaged: its lighthouse leaves out a replica that asks
    # for the quorum later than its join timeout, and that replica heals at the next one. In
    # the other paths, a member left out fails the step's collectives: every process that
    # completed a step averaged it.
    world = victim + 1  # the lost replica is the last
    averaged: Dict[
        int, int
    ] = {}  # per step: the replicas whose gradients its update averaged
    for step in {e["step"] for e in completed}:
        of_step = [e for e in completed if e["step"] == step]
        logged = [
            e["participants"] for e in of_step if e.get("participants") is not None
        ]
        averaged[step] = min(logged) if logged else len({e["slot"] for e in of_step})
    members = {
        step: world - 1 if left_at <= step < first_join["step"] else world
        for step in averaged
    }
    return {
        "end": end,
        "kill_to_survivors_step_s": (recovered - kill["t"]) / 1e9,
        "new_process_to_first_step_s": (first_join["t"] - spawned[first_join["pid"]])
        / 1e9,
        "left_at": left_at,
        "joined_at": first_join["step"],
        "discarded_attempts": discarded,
        "lost_updates": len(set(range(end)) - {e["step"] for e in completed}),
        "short_steps": sum(averaged[step] < members[step] for step in averaged),
        "steady_step_s": statistics.median(step_times) if step_times else None,
        "steady_rss_mb": steady_rss,
        "recovery_rss_mb": recovery_rss,
        "recovery_rss_over_steady": recovery_rss / steady_rss,
        "graphs_after_warmup": sum(e["graphs_after_warmup"] for e in finals),
        "digests": {str(e["slot"]): e["digest"] for e in finals},
        # Data parallel: every replica ends with the same parameters and Adam state.
        "replicas_identical": len({e["digest"] for e in finals}) == 1,
    }


def compare_finals(run_dir: str, reference_dir: str, world: int) -> dict:
    """The largest difference of a parameter from the reference's, and the norm of the difference
    relative to the reference's: Adam turns a rounding difference in a gradient near zero into
    an update of the other sign, so the largest difference can be as large as a few updates.
    """
    diffs, relative = [], []
    for slot in range(world):
        run = torch.load(os.path.join(run_dir, f"final-{slot}.pt"))
        ref = torch.load(os.path.join(reference_dir, f"final-{slot}.pt"))
        diffs.append(max((a - b).abs().max().item() for a, b in zip(run, ref)))
        difference = math.sqrt(
            sum((a - b).double().square().sum().item() for a, b in zip(run, ref))
        )
        relative.append(
            difference / math.sqrt(sum(b.double().square().sum().item() for b in ref))
        )
    return {
        "max_abs_diff": max(diffs),
        "relative_l2_diff": max(relative),
        "parameters_bitwise_equal": max(diffs) == 0.0,
    }


# No fault: the steady step, and the call against its collectives


def steady_replica(args) -> int:
    """A rank that trains --warmup steps, then times --steps steps, with nothing else per step."""
    process = Process(args)
    process.init_whole_group("steady")
    net = process.compiled(DistributedDataParallel(process.model))
    times = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        process.train_step(net, step)
        times.append(time.perf_counter() - start)
    # Which DDP ran: the series adds this method, stock DDP has none.
    series = hasattr(DistributedDataParallel, "_agree_on_process_group_update")
    process.events.log("steady", times=times[args.warmup :], series=series)
    dist.destroy_process_group()
    return 0


class RecordingGroup(dist.ProcessGroup):
    """Runs the collectives of ``inner`` and records each: its kind, its tensors, its root."""

    def __init__(self, inner):
        super().__init__(inner.rank(), inner.size())
        self.inner = inner
        self.recorded = []

    def getBackendName(self):
        return "recording"

    def allreduce(self, tensors, opts=None):
        self.recorded.append(("allreduce", [t.clone() for t in tensors], None))
        return self.inner.allreduce(tensors, opts or dist.AllreduceOptions())

    def allgather(self, output_tensors, input_tensors, opts=None):
        self.recorded.append(("allgather", [t.clone() for t in input_tensors], None))
        return self.inner.allgather(
            output_tensors,
            input_tensors,
            opts or dist.distributed_c10d.AllgatherOptions(),
        )

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.distributed_c10d.BroadcastOptions()
        self.recorded.append(("broadcast", [t.clone() for t in tensors], opts.rootRank))
        return self.inner.broadcast(tensors, opts)


def run_collective(
    group, kind: str, tensors: List[torch.Tensor], root: Optional[int]
) -> None:
    if kind == "allreduce":
        group.allreduce(tensors, dist.AllreduceOptions()).wait()
    elif kind == "allgather":
        outputs = [[torch.empty_like(t) for _ in range(group.size())] for t in tensors]
        group.allgather(
            outputs, tensors, dist.distributed_c10d.AllgatherOptions()
        ).wait()
    else:
        opts = dist.distributed_c10d.BroadcastOptions()
        opts.rootRank = root
        group.broadcast(tensors, opts).wait()


def call_replica(args) -> int:
    """Times _update_process_group() onto a new group of the same ranks, then its collectives alone."""
    process = Process(args)
    process.init_whole_group("call")
    ddp = DistributedDataParallel(process.model)
    for step in range(3):  # past the first iteration, which rebuilds the buckets
        process.train_step(ddp, step)
    results = {}
    for sync in (False, True):
        # What the call sends, recorded once through a group that forwards to a real one.
        recorder = RecordingGroup(dist.new_group(list(range(args.world))))
        ddp._update_process_group(recorder, sync_module_states=sync)
        calls = []
        for _ in range(args.repeats):
            group = dist.new_group(list(range(args.world)))
            dist.barrier()
            start = time.perf_counter()
            ddp._update_process_group(group, sync_module_states=sync)
            calls.append(time.perf_counter() - start)
        group = dist.new_group(list(range(args.world)))
        collectives = []
        for kind, tensors, root in recorder.recorded:
            alone = []
            for _ in range(args.repeats):
                dist.barrier()
                start = time.perf_counter()
                run_collective(group, kind, tensors, root)
                alone.append(time.perf_counter() - start)
            collectives.append(
                {
                    "kind": kind,
                    "bytes": sum(t.numel() * t.element_size() for t in tensors),
                    "s": statistics.median(alone),
                }
            )
        results[CALL_MODES[sync]] = {
            "call_s": statistics.median(calls),
            "collectives": collectives,
        }
    process.events.log("call", results=results)
    dist.destroy_process_group()
    return 0


# t quantiles (0.975) by degrees of freedom, for the 95% interval of a mean of a few repeats.
T975 = {
    1: 12.71,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    12: 2.179,
    15: 2.131,
    20: 2.086,
    30: 2.042,
}


def interval(ratios: List[float]) -> tuple:
    """The mean ratio and its 95% interval, from the repeats' ratios (a t-interval of their logs)."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.mean(logs)
    if len(logs) < 2:
        return math.exp(mean), None, None
    t = T975[max(k for k in T975 if k <= len(logs) - 1)]
    half = t * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def verdict(low: Optional[float], high: Optional[float], limit: float) -> str:
    if high is None:
        return "inconclusive"
    return "met" if high <= limit else "not met" if low > limit else "inconclusive"


def error_path(events_dir: str, pid: int) -> str:
    """Where process ``pid`` records the exception that ended it."""
    return os.path.join(events_dir, f"error-{pid}.txt")


def recorded_error(events_dir: str, pid: int) -> Optional[str]:
    """The exception that process ``pid`` recorded, or None where it recorded none."""
    path = pathlib.Path(error_path(events_dir, pid))
    return path.read_text() if path.exists() else None


def launch_group(
    args, cell: Cell, role: str, *, stock: bool = False, extra=()
) -> List[dict]:
    """Starts cell.world processes of ``role`` with no fault and returns their events."""
    with tempfile.TemporaryDirectory() as workdir:
        store = dist.TCPStore(
            "localhost",
            0,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=args.timeout),
        )
        env = dict(os.environ)
        python = stock_torch.command(env) if stock else [sys.executable]
        procs = []
        for slot in range(cell.world):
            cmd = python + [
                os.path.abspath(__file__),
                "--role",
                role,
                "--slot",
                str(slot),
                "--world",
                str(cell.world),
            ]
            cmd += [
                "--size",
                cell.size,
                "--compile-mode",
                cell.compile,
                "--port",
                str(store.port),
            ]
            cmd += ["--events", workdir, "--timeout", str(args.timeout), *extra]
            procs.append(subprocess.Popen(cmd, env=env))
        codes = [p.wait() for p in procs]
        failed = [p.pid for p in procs if p.returncode]
        if failed:
            error = recorded_error(workdir, failed[0]) or "no error recorded"
            raise RunFailed(
                f"the {role} processes exited with {codes}; one with {error}"
            )
        return read_events(workdir)


def measure_steady(args, cell: Cell) -> dict:
    """Stock DDP and the series, in separate processes, interleaved; torchft beside them."""
    extra = ("--warmup", str(args.steady_warmup), "--steps", str(args.steady_steps))
    ratios, found = [], {"stock": [], "series": [], "torchft": []}
    for repeat in range(args.steady_repeats):
        order = ("stock", "series") if repeat % 2 == 0 else ("series", "stock")
        for flavor in order:
            events = [
                e
                for e in launch_group(
                    args, cell, "steady", stock=flavor == "stock", extra=extra
                )
                if e["kind"] == "steady"
            ]
            if {e["series"] for e in events} != {flavor == "series"}:
                raise RunFailed(f"the {flavor} processes ran the other DDP")
            found[flavor].append(max(statistics.median(e["times"]) for e in events))
        ratios.append(found["series"][-1] / found["stock"][-1])
        if "torchft" in args.paths:
            with tempfile.TemporaryDirectory() as workdir:
                driver = Driver(
                    args,
                    dataclasses.replace(cell, path="torchft"),
                    workdir,
                    steady=args.steady_warmup + args.steady_steps,
                )
                times = [
                    e["t"]
                    for e in driver.run()
                    if e["kind"] == "step" and e["slot"] == 0
                ]
            found["torchft"].append(
                statistics.median(
                    (b - a) / 1e9
                    for a, b in zip(
                        times[args.steady_warmup - 1 :], times[args.steady_warmup :]
                    )
                )
            )
        progress(
            f"    steady {repeat + 1}/{args.steady_repeats}: "
            + ", ".join(f"{k} {v[-1] * 1e3:.1f} ms" for k, v in found.items() if v)
        )
    mean, low, high = interval(ratios)
    result = {
        "repeats": args.steady_repeats,
        "stock_step_s": statistics.median(found["stock"]),
        "series_step_s": statistics.median(found["series"]),
        "series_over_stock": mean,
        "interval_95": [low, high],
        "verdict": verdict(low, high, GOALS["steady_over_stock"]),
    }
    if found["torchft"]:
        torchft = [t / s for t, s in zip(found["torchft"], found["stock"])]
        mean, low, high = interval(torchft)
        result.update(
            torchft_step_s=statistics.median(found["torchft"]),
            torchft_over_stock=mean,
            torchft_interval_95=[low, high],
        )
    return result


def measure_call(args, cell: Cell) -> dict:
    events = launch_group(
        args, cell, "call", extra=("--repeats", str(args.call_repeats))
    )
    calls = [e["results"] for e in events if e["kind"] == "call"]
    result = {}
    for mode in CALL_MODES:
        # The slowest rank's call, against the slowest rank's sum of the collectives alone.
        call = max(c[mode]["call_s"] for c in calls)
        collectives = max(sum(x["s"] for x in c[mode]["collectives"]) for c in calls)
        result[mode] = {
            "call_s": call,
            "collectives_s": collectives,
            "call_over_collectives": call / collectives,
            "rounds": len(calls[0][mode]["collectives"]),
            "collectives": [
                {"kind": x["kind"], "bytes": x["bytes"]}
                for x in calls[0][mode]["collectives"]
            ],
            "met": call / collectives <= GOALS["call_over_collectives"],
        }
    return result


def progress(text: str) -> None:
    print(text, flush=True)


def measure_cell(args, cell: Cell) -> dict:
    """One path: the run with the fault, then path a replaying its schedule, compared."""
    with tempfile.TemporaryDirectory() as workdir:
        driver = Driver(args, cell, workdir)
        run = analyze(driver.run(), driver.spawned, driver.victim)
        reference_cell = dataclasses.replace(cell, path="a")
        with tempfile.TemporaryDirectory() as refdir:
            Driver(args, reference_cell, refdir, reference=run).run()
            reference = [
                e
                for e in read_events(os.path.join(refdir, "events"))
                if e["kind"] == "final"
            ]
            run.update(
                compare_finals(
                    driver.events_dir, os.path.join(refdir, "events"), cell.world
                )
            )
        reference_digests = {str(e["slot"]): e["digest"] for e in reference}
        run["bitwise_equal_to_reference"] = run.pop("digests") == reference_digests
    return run


def short_steps(cell: dict) -> str:
    """A cell's steps short of a member; measurements from before the count have none."""
    return str(cell["short_steps"]) if "short_steps" in cell else "n/c"


def table(data: dict) -> str:
    lines = [
        f"{'world':>5} {'size':>5} {'compile':8} {'killed in':13} {'path':14} {'kill->step s':>12} "
        f"{'new->step s':>11} {'discarded':>9} {'lost':>4} {'short':>5} {'exact':>5} {'max diff':>9} {'graphs':>6} "
        f"{'RSS/st':>6} {'step ms':>7}"
    ]
    for key, r in data["cells"].items():
        world, size, compile_mode, kill_in, path = key.split("-", 4)
        row = f"{world[1:]:>5} {size:>5} {compile_mode:8} {kill_in:13} {path:14}"
        if "error" in r:
            lines.append(f"{row} failed: {r['error']}")
            continue
        lines.append(
            f"{row} {r['kill_to_survivors_step_s']:12.2f} "
            f"{r['new_process_to_first_step_s']:11.2f} {r['discarded_attempts']:9d} {r['lost_updates']:4d} "
            f"{short_steps(r):>5} {'yes' if r['bitwise_equal_to_reference'] else 'no':>5} {r['max_abs_diff']:9.2e} "
            f"{r['graphs_after_warmup']:6d} {r['recovery_rss_over_steady']:6.2f} "
            f"{(r['steady_step_s'] or 0) * 1e3:7.1f}"
        )
    for key, r in data["steady"].items():
        if "error" in r:
            lines.append(f"steady {key}: failed: {r['error']}")
            continue
        low, high = r["interval_95"]
        text = (
            f"steady {key}: series/stock {r['series_over_stock']:.4f} "
            f"(95% {low if low is None else round(low, 4)}..{high if high is None else round(high, 4)}, "
            f"{r['repeats']} repeats): {r['verdict']} (goal {GOALS['steady_over_stock']})"
        )
        if "torchft_over_stock" in r:
            text += f"; torchft/stock {r['torchft_over_stock']:.3f}"
        lines.append(text)
    for key, r in data["call"].items():
        if "error" in r:
            lines.append(f"call {key}: failed: {r['error']}")
            continue
        for mode in CALL_MODES:
            m = r[mode]
            lines.append(
                f"call {key} {mode:7}: {m['call_s'] * 1e3:8.2f} ms, its {m['rounds']} collectives alone "
                f"{m['collectives_s'] * 1e3:8.2f} ms: x{m['call_over_collectives']:.2f} "
                f"({'met' if m['met'] else 'not met'}, goal {GOALS['call_over_collectives']})"
            )
    return "\n".join(lines)


def escaped(error: str) -> str:
    """An error's first 160 characters, for a cell of a Markdown table."""
    return error[:160].replace("|", "\\|")


def markdown(data: dict) -> str:
    """The file's measurements as the Markdown tables of docs/benchmark.md."""
    lines = [
        "| world | size | compile | killed in | path | kill → survivors' next step, s | new process → its first "
        "step, s | discarded | lost | short of a member | equal to the reference | RSS in recovery / steady | "
        "graphs after warm-up |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def cell_order(key: str) -> tuple:
        config, path = key.rsplit("-", 1)
        return config_order(config), PATHS.index(path)

    for key in sorted(data["cells"], key=cell_order):
        r = data["cells"][key]
        world, size, compile_mode, kill_in, path = key.split("-", 4)
        row = f"| {world[1:]} | {size} | {compile_mode} | {kill_in.replace('_', ' ')} | {path} |"
        if "error" in r:
            lines.append(f"{row} failed: {escaped(r['error'])} | | | | | | | |")
            continue
        exact = (
            "bitwise"
            if r["bitwise_equal_to_reference"]
            else f"no: at most {r['max_abs_diff']:.1e}"
            + (
                f", relative L2 {r['relative_l2_diff']:.1e}"
                if "relative_l2_diff" in r
                else ""
            )
        )
        lines.append(
            f"{row} {r['kill_to_survivors_step_s']:.2f} | {r['new_process_to_first_step_s']:.2f} | "
            f"{r['discarded_attempts']} | {r['lost_updates']} | {short_steps(r)} | {exact} | "
            f"{r['recovery_rss_over_steady']:.2f} | "
            f"{r['graphs_after_warmup']} |"
        )
    lines += [
        "",
        "| world | size | compile | stock step, ms | series / stock | 95% interval | verdict (goal "
        f"{GOALS['steady_over_stock']}) | torchft / stock |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key in sorted(data["steady"], key=config_order):
        r = data["steady"][key]
        world, size, compile_mode = key.split("-")
        if "error" in r:
            lines.append(
                f"| {world[1:]} | {size} | {compile_mode} | failed: {escaped(r['error'])} | | | | |"
            )
            continue
        low, high = r["interval_95"]
        torchft = (
            f"{r['torchft_over_stock']:.3f}" if "torchft_over_stock" in r else "not run"
        )
        lines.append(
            f"| {world[1:]} | {size} | {compile_mode} | {r['stock_step_s'] * 1e3:.1f} | "
            f"{r['series_over_stock']:.3f} | {low:.3f} to {high:.3f} | {r['verdict']} | {torchft} |"
        )
    lines += [
        "",
        "| world | size | `sync_module_states` | call, ms | rounds | its collectives alone, ms | ratio (goal "
        f"{GOALS['call_over_collectives']}) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key in sorted(data["call"], key=config_order):
        r = data["call"][key]
        world, size = key.split("-")
        if "error" in r:
            lines.append(
                f"| {world[1:]} | {size} | | failed: {escaped(r['error'])} | | | |"
            )
            continue
        for mode in CALL_MODES:
            m = r[mode]
            lines.append(
                f"| {world[1:]} | {size} | {'yes' if mode == 'sync' else 'no'} | {m['call_s'] * 1e3:.2f} | "
                f"{m['rounds']} | {m['collectives_s'] * 1e3:.2f} | {m['call_over_collectives']:.2f}, "
                f"{'met' if m['met'] else 'not met'} |"
            )
    return "\n".join(lines)


def plot(data: dict, path: pathlib.Path) -> None:
    """Four panels: the two recovery times of each path per configuration, the steady step
    over stock DDP's with its 95% interval, and the call over its collectives alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ((kill, new), (steady, call)) = plt.subplots(2, 2, figsize=(16, 9))
    # A configuration and where the kill came: the key of a cell without its path.
    configs = sorted({key.rsplit("-", 1)[0] for key in data["cells"]}, key=config_order)
    width = 0.8 / len(PATHS)
    for ax, field, title in (
        (kill, "kill_to_survivors_step_s", "Kill to the survivors' next step"),
        (new, "new_process_to_first_step_s", "New process to its first step"),
    ):
        labeled = set()
        for (x, config), (i, recovery_path) in itertools.product(
            enumerate(configs), enumerate(PATHS)
        ):
            r = data["cells"].get(f"{config}-{recovery_path}")
            if r is None:
                continue
            position = x + (i - (len(PATHS) - 1) / 2) * width
            if "error" in r:
                ax.text(
                    position,
                    0.02,
                    f"{recovery_path}: failed",
                    rotation=90,
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    color=f"C{i}",
                    transform=ax.get_xaxis_transform(),
                )
                continue
            ax.bar(
                position,
                r[field],
                width,
                color=f"C{i}",
                label=None if recovery_path in labeled else recovery_path,
            )
            labeled.add(recovery_path)
        ax.set_xticks(range(len(configs)), configs, rotation=30, ha="right", fontsize=7)
        ax.set(ylabel="seconds", yscale="log", title=title)
    steady_keys = sorted(data["steady"], key=config_order)
    for x, key in enumerate(steady_keys):
        r = data["steady"][key]
        if "error" in r:
            continue
        low, high = r["interval_95"]
        mean = r["series_over_stock"]
        steady.errorbar(
            x,
            mean,
            yerr=[[mean - low], [high - mean]] if low is not None else None,
            fmt="o",
            color="C0",
            capsize=3,
            label="series / stock" if x == 0 else None,
        )
        if "torchft_over_stock" in r:
            steady.plot(
                x,
                r["torchft_over_stock"],
                "s",
                color="C2",
                label="torchft / stock" if x == 0 else None,
            )
    steady.axhline(
        GOALS["steady_over_stock"],
        color="k",
        linestyle="--",
        linewidth=0.8,
        label="goal",
    )
    steady.axhline(1.0, color="k", linewidth=0.5)
    steady.set_xticks(
        range(len(steady_keys)), steady_keys, rotation=30, ha="right", fontsize=7
    )
    steady.set(
        ylabel="step time / stock DDP's", title="Steady step, with the 95% interval"
    )
    call_keys = sorted(data["call"], key=config_order)
    for i, mode in enumerate(CALL_MODES):
        points = [
            (x, data["call"][key][mode]["call_over_collectives"])
            for x, key in enumerate(call_keys)
            if "error" not in data["call"][key]
        ]
        call.plot(
            [x for x, _ in points],
            [y for _, y in points],
            "o",
            color=f"C{i}",
            label=f"sync_module_states={mode == 'sync'}",
        )
    call.axhline(
        GOALS["call_over_collectives"],
        color="k",
        linestyle="--",
        linewidth=0.8,
        label="goal",
    )
    call.set_xticks(range(len(call_keys)), call_keys, fontsize=7)
    call.set(
        ylabel="call / its collectives alone", title="The _update_process_group call"
    )
    for ax in (kill, new, steady, call):
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    machine = data["machine"]
    fig.suptitle(
        f"Recovery after a lost rank: torch {machine['torch']}, torchft {machine['torchft']}, "
        f"Gloo, {machine['cpus']} CPUs",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def config_order(key: str) -> tuple:
    """By world, then model size, then the rest (compile mode, where the kill came): w2-10M-none
    sorts after w2-1M-inductor."""
    world, size, *rest = key.split("-")
    return int(world[1:]), list(SIZES).index(size), rest


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument(
        "--sizes",
        nargs="+",
        default=["1M", "10M"],
        choices=sorted(SIZES),
        help="100M runs on 2 ranks only",
    )
    parser.add_argument(
        "--compile",
        nargs="+",
        default=["none", "inductor"],
        choices=["none", "inductor"],
    )
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    parser.add_argument(
        "--steps-after-join",
        type=int,
        default=5,
        help="steps of a run after the new process's first",
    )
    parser.add_argument("--kill-step", type=int, default=5)
    parser.add_argument(
        "--kill-in",
        nargs="+",
        default=list(KILL_IN),
        choices=KILL_IN,
        help="where the replica is killed: inside its backward pass (from a hook on the embedding's "
        "gradient, after the other buckets' allreduces started), or between steps (before it starts "
        "the step of the kill, after every replica completed the one before)",
    )
    parser.add_argument(
        "--join-after",
        type=int,
        default=3,
        help="steps the survivors complete before the new process starts",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="of stores and the driver's waits, in seconds",
    )
    parser.add_argument(
        "--collective-timeout",
        type=float,
        default=10.0,
        help="of the groups' collectives, in seconds: in Gloo's ring, a survivor that is not the "
        "lost rank's neighbor learns of the loss only when its collective times out",
    )
    parser.add_argument("--lighthouse-heartbeat-timeout-ms", type=int, default=1000)
    parser.add_argument("--lighthouse-join-timeout-ms", type=int, default=100)
    parser.add_argument("--lighthouse-tick-ms", type=int, default=100)
    parser.add_argument("--steady-repeats", type=int, default=6)
    parser.add_argument("--steady-warmup", type=int, default=3)
    parser.add_argument("--steady-steps", type=int, default=20)
    parser.add_argument("--call-repeats", type=int, default=10)
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["recovery", "steady", "call"]
    )
    parser.add_argument(
        "--markdown",
        action="store_true",
        help="print the file's measurements as Markdown tables (with --skip recovery steady call, "
        "and nothing is measured)",
    )
    parser.add_argument(
        "--again",
        action="store_true",
        help="measure again what the file in --out already has (by default kept, so that a run "
        "that stopped goes on where it stopped)",
    )
    parser.add_argument(
        "--out", type=pathlib.Path, default=pathlib.Path(__file__).parent / "results"
    )
    # A process of the benchmark.
    parser.add_argument(
        "--role",
        choices=["driver", "replica", "torchft", "steady", "call"],
        default="driver",
    )
    for name in (
        "--steps",
        "--slot",
        "--world",
        "--port",
        "--kill-step-of-process",
        "--first-generation",
        "--repeats",
        "--warmup",
    ):
        parser.add_argument(name, type=int, help=argparse.SUPPRESS)
    for name in (
        "--size",
        "--compile-mode",
        "--path",
        "--events",
        "--checkpoint",
        "--lighthouse",
        "--kill-in-process",
    ):
        parser.add_argument(name, help=argparse.SUPPRESS)
    parser.add_argument("--host", default="localhost", help=argparse.SUPPRESS)
    parser.add_argument("--restarted", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role != "driver":
        args.compile, args.kill_step, args.kill_in = (
            args.compile_mode,
            args.kill_step_of_process,
            args.kill_in_process,
        )
        try:
            return {
                "replica": lambda a: Replica(a).run(),
                "torchft": torchft_replica,
                "steady": steady_replica,
                "call": call_replica,
            }[args.role](args)
        except BaseException as e:
            # What the driver reports. Stderr cannot say which error ended the process: torchft
            # logs the errors it handles with their tracebacks.
            with open(error_path(args.events, os.getpid()), "w") as f:
                f.write(f"{type(e).__name__}: {next(iter(str(e).splitlines()), '')}")
            raise

    if "torchft" in args.paths and importlib.util.find_spec("torchft") is None:
        parser.error(
            "path torchft needs torchft 0.2.0 (pip install torchft==0.2.0), or leave it out of --paths"
        )
    if "a_reconfigure" in args.paths and not hasattr(dist, "_reconfigure"):
        parser.error(
            f"path a_reconfigure needs torch 2.14 or later; this is {torch.__version__}"
        )
    if args.kill_step < 2 or args.steps_after_join < 3:
        parser.error(
            "--kill-step must be at least 2 (a step after the first), --steps-after-join at least 3"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "recovery_after_lost_rank.json"
    data = json.loads(out.read_text()) if out.exists() else {}
    data.setdefault("cells", {}), data.setdefault("steady", {}), data.setdefault(
        "call", {}
    )
    data["machine"] = {
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torchft": importlib.util.find_spec("torchft")
        and importlib.metadata.version("torchft"),
    }
    data["lighthouse"] = {
        "heartbeat_timeout_ms": args.lighthouse_heartbeat_timeout_ms,
        "join_timeout_ms": args.lighthouse_join_timeout_ms,
        "quorum_tick_ms": args.lighthouse_tick_ms,
    }
    data["collective_timeout_s"] = args.collective_timeout
    data["goals"] = GOALS
    configs = [
        (w, s, c)
        for w in args.worlds
        for s in args.sizes
        for c in args.compile
        if s != "100M" or w == 2
    ]

    def measure(
        results: Dict[str, dict], key: str, what: str, function, failures
    ) -> None:
        """Runs ``function`` into ``results[key]`` and saves the file, unless an earlier run did."""
        if key in results and not args.again:
            progress(
                f"[{key}] {what}: kept from the run of {results[key].get('date', 'an earlier day')} "
                "(--again measures it again)"
            )
            return
        progress(f"[{key}] {what}")
        try:
            result = function()
        except failures as e:
            result = {"error": f"{type(e).__name__}: {e}"}
        results[key] = {**result, "date": datetime.date.today().isoformat()}
        out.write_text(json.dumps(data, indent=1) + "\n")

    for world, size, compile_mode in configs:
        base = Cell(world, size, compile_mode, "a")
        if "recovery" not in args.skip:
            for kill_in, path in itertools.product(args.kill_in, args.paths):
                cell = dataclasses.replace(base, path=path, kill_in=kill_in)
                measure(
                    data["cells"],
                    cell.key,
                    f"a replica killed at step {args.kill_step} ({kill_in}), then replaced",
                    lambda: measure_cell(args, cell),
                    (RunFailed, StopIteration, ValueError),
                )
        if "steady" not in args.skip:
            measure(
                data["steady"],
                f"w{world}-{size}-{compile_mode}",
                "steady step: stock, series, torchft",
                lambda: measure_steady(args, base),
                RunFailed,
            )
        if "call" not in args.skip and compile_mode == "none":
            measure(
                data["call"],
                f"w{world}-{size}",
                "the call against its collectives",
                lambda: measure_call(args, base),
                RunFailed,
            )
    print(markdown(data) if args.markdown else table(data))
    plot(data, out.with_suffix(".png"))
    progress(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
