"""The driver of a run: starts the worker processes, kills and replaces one, publishes the plans."""

import datetime
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

from benchmarks.recovery import stock_torch
from benchmarks.recovery.cells import (
    Cell,
    FIRST,
    HEARTBEAT_DETECTIONS,
    MAX_STEPS,
    REJOINED,
    SURVIVORS,
    TORCHFT_PATHS,
)
from benchmarks.recovery.events import read_events, read_recorded_error
from benchmarks.recovery.membership import HeartbeatDetector

REPO = pathlib.Path(__file__).resolve().parents[2]
# torchft-nightly's venv: it ships the package torchft, as 0.2.0 does, so it has one of its own.
TORCHFT_NIGHTLY_VENV = REPO / ".venv-torchft-nightly"


class RunFailed(Exception):
    pass


def make_worker_command(
    module: str,
    env: Dict[str, str],
    *,
    stock: bool = False,
    python: Optional[str] = None,
) -> List[str]:
    """Return the start of the command line of worker ``module`` (worker_replica, ...), and
    set in ``env`` what it needs: the repository on its path; on stock torch, the wheel's
    own files; with ``python``, another venv's interpreter (its torch is stock)."""
    # The overlay venv has this package installed, but neither torchft-nightly's venv nor a
    # stock process (python -S skips site-packages, where it is installed) can import it, and
    # the workers import examples/, which is not in it.
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), env.get("PYTHONPATH")])
    )
    name = f"benchmarks.recovery.{module}"
    if python is not None:
        return [python, "-m", name]
    if stock:
        return stock_torch.make_command(env) + ["-m", stock_torch.__name__, name]
    return [sys.executable, "-m", name]


def find_torchft_nightly_python() -> str:
    """Return torchft-nightly's venv's interpreter (scripts/benchmark --torchft-nightly makes it)."""
    return str(TORCHFT_NIGHTLY_VENV / "bin" / "python")


class NightlyLighthouse:
    """torchft-nightly's lighthouse, its own binary in its venv: the one of the driver's venv
    is 0.2.0's."""

    def __init__(self, min_replicas: int, args):
        with socket.socket() as probe:
            probe.bind(("localhost", 0))
            self.port = probe.getsockname()[1]
        self.proc = subprocess.Popen(
            [
                str(TORCHFT_NIGHTLY_VENV / "bin" / "torchft_lighthouse"),
                "--bind",
                f"[::]:{self.port}",
                "--min_replicas",
                str(min_replicas),
                "--join_timeout_ms",
                str(args.lighthouse_join_timeout_ms),
                "--quorum_tick_ms",
                str(args.lighthouse_tick_ms),
                "--heartbeat_timeout_ms",
                str(args.lighthouse_heartbeat_timeout_ms),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("localhost", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RunFailed("torchft-nightly's lighthouse did not start")
                time.sleep(0.05)

    def address(self) -> str:
        return f"http://localhost:{self.port}"

    def shutdown(self) -> None:
        self.proc.kill()
        self.proc.wait()


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
        self.detected_at: Optional[int] = None  # monotonic_ns, where the driver detects

    def spawn(
        self,
        slot: int,
        path: str,
        *,
        first_generation: int = FIRST,
        kill: bool = False,
        restarted: bool = False,
    ) -> int:
        env = dict(os.environ)
        # torchft's users run stock torch: its DDP subclasses stock DDP here.
        cmd = make_worker_command(
            "worker_torchft" if path in TORCHFT_PATHS else "worker_replica",
            env,
            stock=path == "torchft",
            python=find_torchft_nightly_python() if path == "torchft_nightly" else None,
        )
        cmd += [
            "--slot",
            str(slot),
            "--world",
            str(self.cell.world),
            "--size",
            self.cell.size,
        ]
        cmd += [
            "--compile",
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
                "--kill-step",
                str(self.args.kill_step),
                "--kill-in",
                self.cell.kill_in,
            ]
        if restarted:
            cmd += ["--restarted"]
        if self.cell.detection in HEARTBEAT_DETECTIONS and self.reference is None:
            cmd += ["--heartbeat-period", str(self.args.heartbeat_period)]
            if (
                self.cell.detection == "heartbeat_socket_shutdown"
                and first_generation == FIRST
            ):
                cmd += ["--abort-by-socket-shutdown"]
        if (
            self.args.hold_survivors_at_the_kill
            and self.reference is None
            and first_generation == FIRST
            and not kill
        ):
            cmd += ["--hold-before-kill-step", "--kill-step", str(self.args.kill_step)]
        if self.lighthouse is not None:
            cmd += ["--lighthouse", self.lighthouse.address()]
        start = time.monotonic_ns()
        stderr = tempfile.NamedTemporaryFile("w", dir=self.events_dir, delete=False)
        proc = subprocess.Popen(cmd, env=env, stderr=stderr)
        stderr.close()
        os.rename(stderr.name, self.locate_stderr(proc.pid))
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
        """Publish the plan of ``generation``. Where it has joiners, its step is that of the
        switch to it, and it ends --steps-after-join steps later; else it ends at ``end``
        (restart), or goes on.
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

    def read_last_error(self, pid: int) -> str:
        """Return process ``pid``'s exception, as it recorded it. Where it recorded none (a C++
        abort), the last line of its stderr that names an error, else its last line."""
        recorded = read_recorded_error(self.events_dir, pid)
        if recorded is not None:
            return recorded[:300]
        with open(self.locate_stderr(pid)) as f:
            lines = [line.strip() for line in f if line.strip()]
        errors = [
            line
            for line in lines
            if re.match(r"(\[rank\d+\]: )*[\w.]*(Error|Exception)\b", line)
        ]
        return (errors or lines or ["nothing on stderr"])[-1][:300]

    def locate_stderr(self, pid: int) -> str:
        return os.path.join(self.events_dir, f"stderr-{pid}.txt")

    def list_events(self) -> List[dict]:
        return read_events(self.events_dir)

    def find_last_completed_step(self, slots) -> int:
        """Return the last step that every process of ``slots`` completed since the fault (-1 if none)."""
        last = {}
        for e in self.list_events():
            if e["kind"] == "step" and e["slot"] in slots:
                last[e["slot"]] = max(last.get(e["slot"], -1), e["step"])
        return min(last.get(s, -1) for s in slots)

    def wait(self, condition, what: str) -> None:
        """Wait until ``condition()``; raise RunFailed where a process failed or time ran out."""
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
                    f"one with {code}: {self.read_last_error(pid)}"
                )
            if time.monotonic() > deadline:
                raise RunFailed(f"timed out waiting for {what}")
            time.sleep(0.005)

    def run(self) -> List[dict]:
        """Run the cell to its end; return every process's events."""
        try:
            if self.cell.path in TORCHFT_PATHS:
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
                    f"{self.read_last_error(failed[0])}"
                )
            return self.list_events()
        finally:
            for p in self.procs.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
            if self.lighthouse is not None:
                self.lighthouse.shutdown()

    def run_reference(self) -> None:
        """Run path new_group with the membership schedule of a run: the lost slot leaves at
        its step, the new process joins at its; no process is killed."""
        everyone, survivors = list(range(self.cell.world)), list(
            range(self.cell.world - 1)
        )
        self.publish(FIRST, everyone, [])
        self.store.set(f"switch/{FIRST}", str(self.reference["left_at"]))
        self.publish(SURVIVORS, survivors, [])
        self.store.set(f"switch/{SURVIVORS}", str(self.reference["joined_at"]))
        self.publish(REJOINED, everyone, [self.victim])
        for slot in everyone:
            self.spawn(slot, "new_group")
        self.spawn(self.victim, "new_group", first_generation=REJOINED)

    def run_with_fault(self) -> None:
        path, everyone = self.cell.path, list(range(self.cell.world))
        survivors = everyone[:-1]
        first = {
            slot: self.spawn(slot, path, kill=slot == self.victim) for slot in everyone
        }
        self.publish(FIRST, everyone, [])
        lost = self.detect_loss(first)
        self.detected_at = time.monotonic_ns()
        if lost != [self.victim]:
            raise RunFailed(f"the detector took {lost} as lost, not [{self.victim}]")
        if path == "restart":
            # TorchElastic's agent stops the other workers and starts them all again.
            self.restart(survivors, SURVIVORS, restart=1)
        else:
            self.publish(SURVIVORS, survivors, [])
            # The membership key, which the survivors check before each step.
            self.store.set(f"lost/{FIRST}", json.dumps(lost))
        if self.cell.detection == "heartbeat_socket_shutdown":
            self.store.set("abort", "1")
        if self.cell.detection == "heartbeat_fence":
            self.kill_hung_victim(first)
        if self.args.hold_survivors_at_the_kill:
            self.store.set("hold/released", "1")
        self.wait(
            lambda: self.find_last_completed_step(survivors)
            >= self.args.kill_step + self.args.join_after,
            "the survivors",
        )
        self.kill_hung_victim(first)
        if path == "restart":
            self.restart(everyone, REJOINED, restart=2)
            return
        pid = self.spawn(self.victim, path, first_generation=REJOINED)
        self.wait(
            lambda: any(
                e["kind"] == "ready" and e["pid"] == pid for e in self.list_events()
            ),
            "the new process",
        )
        # The first survivor chooses the step of the switch (Replica.run).
        self.publish(REJOINED, everyone, [self.victim])
        self.store.set(f"admit/{SURVIVORS}", "1")

    def detect_loss(self, first: Dict[int, int]) -> List[int]:
        """Wait until the cell's detection finds a member lost; return the lost slots.

        The local agent sees a process's exit status at once. The heartbeat detector sees
        heartbeats that stopped, after the heartbeat timeout, whatever the cause.
        """
        if self.cell.detection == "local_agent":
            self.wait(
                lambda: any(
                    self.procs[pid].poll() is not None for pid in first.values()
                ),
                "the kill",
            )
            return [
                slot
                for slot, pid in first.items()
                if self.procs[pid].poll() is not None
            ]
        detector = HeartbeatDetector(
            self.store,
            list(first),
            self.args.heartbeat_period,
            self.args.heartbeat_timeout,
        )
        found: List[int] = []

        def detect_lost() -> bool:
            found[:] = detector.find_lost()
            return bool(found)

        self.wait(detect_lost, "a member's heartbeats to stop")
        return sorted(found)

    def kill_hung_victim(self, first: Dict[int, int]) -> None:
        """Kill the victim where it hangs: the run is past it, and it must end."""
        victim = self.procs[first[self.victim]]
        if victim.poll() is None:
            victim.kill()
            victim.wait()

    def restart(self, slots: List[int], generation: int, restart: int) -> None:
        """Kill every process and start those of ``slots`` again from the checkpoint."""
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        step = torch.load(self.checkpoint)["step"]
        end = step + self.args.steps_after_join if generation == REJOINED else None
        self.publish(generation, slots, [], restart=restart, end=end)
        for slot in slots:
            self.spawn(slot, "restart", first_generation=generation, restarted=True)

    def run_torchft(self) -> None:
        if self.cell.path == "torchft_nightly":
            self.lighthouse = NightlyLighthouse(self.cell.world - 1, self.args)
        else:
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
                slot, self.cell.path, kill=slot == self.victim and not self.steady
            )
            for slot in everyone
        }
        if self.steady:
            return
        # torchft's lighthouse detects the loss; the driver only follows the run.
        self.wait(
            lambda: any(e["kind"] == "kill" for e in self.list_events()), "the kill"
        )
        self.wait(
            lambda: self.find_last_completed_step(survivors)
            >= self.args.kill_step + self.args.join_after,
            "the survivors",
        )
        self.kill_hung_victim(first)
        pid = self.spawn(self.victim, self.cell.path, restarted=True)
        # Its first step is everyone's: the run ends a fixed number of steps after it.
        self.wait(
            lambda: any(
                e["kind"] == "step" and e["pid"] == pid for e in self.list_events()
            ),
            "the new process",
        )
        joined = next(
            e["step"]
            for e in self.list_events()
            if e["kind"] == "step" and e["pid"] == pid
        )
        self.store.set("end", str(joined + self.args.steps_after_join))


def launch_group(
    args, cell: Cell, module: str, *, stock: bool = False, extra=()
) -> List[dict]:
    """Start cell.world processes of worker ``module`` with no fault; return their events."""
    with tempfile.TemporaryDirectory() as workdir:
        store = dist.TCPStore(
            "localhost",
            0,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=args.timeout),
        )
        env = dict(os.environ)
        python = make_worker_command(module, env, stock=stock)
        procs = []
        for slot in range(cell.world):
            cmd = python + [
                "--slot",
                str(slot),
                "--world",
                str(cell.world),
            ]
            cmd += [
                "--size",
                cell.size,
                "--compile",
                cell.compile,
                "--port",
                str(store.port),
            ]
            cmd += ["--events", workdir, "--timeout", str(args.timeout), *extra]
            procs.append(subprocess.Popen(cmd, env=env))
        codes = [p.wait() for p in procs]
        failed = [p.pid for p in procs if p.returncode]
        if failed:
            error = read_recorded_error(workdir, failed[0]) or "no error recorded"
            raise RunFailed(
                f"the {module} processes exited with {codes}; one with {error}"
            )
        return read_events(workdir)
