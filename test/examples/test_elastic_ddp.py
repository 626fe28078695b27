"""examples/elastic_ddp.py, run as a user would: real processes, SIGKILL, Gloo over TCP, a TCPStore.

These run with the eager torch.compile backend, to keep them short; the example's default is
inductor. Each case checks the launcher's summary: the step every run must reach, faults
survived, and zero steps lost, recompiles and parameter divergences.
"""

import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import torch

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "elastic_ddp.py"


def launch(*args, timeout=240):
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--compile-backend", "eager", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    # The end of the workers' stderr (an abort's message, say) follows their stdout, so that a
    # failure's message shows both; torch.compile's warnings about the profiler are left out.
    errors = "".join(
        line
        for line in result.stderr.splitlines(True)
        if "Profiler function" not in line
    )
    return result.returncode, result.stdout + errors[-1000:]


def summary(out):
    match = re.search(
        r"faults survived (\d+), steps lost (\d+), recompiles (\d+), parameter divergences (\d+); "
        r"last step completed (\d+) of (\d+)",
        out,
    )
    assert match, out[-3000:]
    return tuple(int(x) for x in match.groups())


# Killed before its optimizer step, the victim's gradients of step 4 were already reduced, so
# the survivors complete step 4 and go on from step 5; killed earlier, step 4 is done again.
@pytest.mark.parametrize(
    "phase, resume", [("forward", 4), ("backward", 4), ("optimizer", 5)]
)
def test_killed_rank_then_a_new_one(phase, resume):
    # The members wait before the last step for the new worker, however slowly it starts.
    rc, out = launch(
        "--workers",
        "3",
        "--steps",
        "12",
        "--kill",
        f"2:4:{phase}",
        "--rejoin",
        "7",
        "--wait-for-joiners",
        "--step-time",
        "0",
    )
    assert rc == 0, out[-3000:]
    assert summary(out) == (1, 0, 0, 0, 11, 11)
    assert f"lost [2]; members [0, 1], state from 0, from step {resume}" in out
    assert re.search(
        r"grow; members \[0, 1, 3\], state from [01], from step \d+", out
    ), out[-3000:]


@pytest.mark.skipif(
    not hasattr(torch.distributed, "_reconfigure"),
    reason="in-place reconfiguration: needs torch 2.14 or later",
)
def test_reconfigure_killed_rank_then_a_new_one():
    # One process group per worker for the whole run, reconfigured in place for each generation.
    rc, out = launch(
        "--reconfigure",
        "--workers",
        "3",
        "--steps",
        "12",
        "--kill",
        "2:4:backward",
        "--rejoin",
        "7",
        "--wait-for-joiners",
        "--step-time",
        "0",
    )
    assert rc == 0, out[-3000:]
    assert summary(out) == (1, 0, 0, 0, 11, 11)
    assert "lost [2]; members [0, 1], state from 0, from step 4" in out
    assert re.search(
        r"grow; members \[0, 1, 3\], state from [01], from step \d+", out
    ), out[-3000:]
    assert "process groups initialized by each worker: {0: 1, 1: 1, 2: 1, 3: 1}" in out


def test_reconfigure_needs_gloo():
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--reconfigure", "--backend", "nccl"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert (
        "--reconfigure needs --backend gloo and a torch with torch.distributed._reconfigure"
        in result.stderr
    )


def test_random_kills_and_rejoins():
    # The kills come at steps 14 and 15 (seed 0), after which the members wait before the
    # last step for both new workers; half a second a step keeps training going until then.
    rc, out = launch(
        "--workers",
        "4",
        "--steps",
        "30",
        "--chaos",
        "2",
        "--seed",
        "0",
        "--wait-for-joiners",
        "--step-time",
        "0.5",
    )
    assert rc == 0, out[-3000:]
    assert summary(out) == (2, 0, 0, 0, 29, 29)
    assert out.count("chaos: SIGKILL worker") == 2
    assert "grow; members" in out, out[-3000:]
    assert "cannot rejoin" not in out, out[-3000:]
    assert re.search(r"exit codes \{.*4: 0, 5: 0\}", out), out[-3000:]


def test_store_gone():
    rc, out = launch("--workers", "2", "--steps", "30", "--stop-store-at", "3")
    assert rc == 0, out[-3000:]
    # Each worker's message is one write; two of them may share a line.
    for uid in (0, 1):
        assert re.search(
            rf"\[worker {uid}\] error: the store at \S+ is gone \(.+?\); exiting", out
        ), out[-3000:]
    assert "exit codes {0: 4, 1: 4}" in out


def test_worker_that_cannot_rejoin():
    # Training ends before the new worker has even started, so no generation takes it in.
    rc, out = launch(
        "--workers", "2", "--steps", "6", "--rejoin", "3", "--step-time", "0"
    )
    assert rc == 0, out[-3000:]
    assert (
        "[worker 2] error: cannot rejoin: training finished before a generation took worker 2 in; exiting"
        in out
    )
    assert summary(out) == (0, 0, 0, 0, 5, 5)


def load_example():
    spec = importlib.util.spec_from_file_location("elastic_ddp", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


@pytest.mark.parametrize(
    "readings, stop",
    [((0, 0, 0), -1), ((0, 9, 0), 8), ((12, 9, 0), 8), ((12, 12, 12), 11)],
)
def test_members_stop_at_the_earliest_stop_any_of_them_read(
    monkeypatch, readings, stop
):
    # Each member reads the launcher's stop (the last step plus one, 0 for none) on its own,
    # and the launcher may write it between two members' reads: the members must still
    # stop at the same boundary, the earliest that any of them read.
    example = load_example()
    monkeypatch.setattr(example, "counter", lambda store, key: readings[0])

    def all_gather_object(gathered, mine):
        gathered[:] = [(f"digest {r}", r) for r in readings]
        assert mine == ("digest", readings[0])

    monkeypatch.setattr(example.dist, "all_gather_object", all_gather_object)
    digests, stop_after = example.gather_with_stop(None, 2, len(readings), "digest")
    assert stop_after == stop
    assert digests == [f"digest {r}" for r in readings]


HEARTBEAT_THEN_EXIT = """
import datetime, importlib.util, sys, time
import torch.distributed as dist
spec = importlib.util.spec_from_file_location("elastic_ddp", sys.argv[1])
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)
example.HEARTBEAT_S = 0  # beat back to back, so that the thread is inside a store call at exit
master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
client = dist.TCPStore("127.0.0.1", master.port, is_master=False, timeout=datetime.timedelta(seconds=30))
heartbeat = example.Heartbeat(client, 0, "127.0.0.1")
time.sleep(0.2)
heartbeat.stop()
beats = master.add("beats/0", 0)
time.sleep(0.2)
assert beats > 0 and master.add("beats/0", 0) == beats, "the heartbeat did not beat, or beat on after stop()"
"""


def test_worker_exits_cleanly_after_its_heartbeat():
    # A thread still inside a TCPStore call while the interpreter finalizes aborts the process
    # (exit code -6), which made a worker that had finished training fail at random.
    for _ in range(3):
        result = subprocess.run(
            [sys.executable, "-c", HEARTBEAT_THEN_EXIT, str(EXAMPLE)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr[-2000:]


def test_bad_kill_argument():
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--kill", "1:x:backward"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "--kill '1:x:backward': expected UID:STEP:PHASE" in result.stderr


def test_nccl_needs_a_gpu_for_each_worker():
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--backend", "nccl", "--workers", "99"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "--backend nccl needs a GPU for each of the 99 workers" in result.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="NCCL: needs a GPU")
def test_nccl_on_one_gpu():
    # One worker, no fault: the NCCL path's devices, groups and waits, which one GPU can run.
    rc, out = launch(
        "--backend", "nccl", "--workers", "1", "--steps", "6", "--step-time", "0"
    )
    assert rc == 0, out[-3000:]
    assert summary(out) == (0, 0, 0, 0, 5, 5)


@pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="NCCL across workers: needs 2 GPUs"
)
def test_nccl_killed_rank_then_a_new_one():
    # The survivor's allreduce never completes: it takes the wait for the GPU that runs out as
    # the failure, aborts the group's NCCL communicators, and goes on alone, then with the new
    # worker on the GPU that the killed one left.
    rc, out = launch(
        "--backend",
        "nccl",
        "--workers",
        "2",
        "--steps",
        "28",
        "--kill",
        "1:4:backward",
        "--rejoin",
        "7",
        "--wait-for-joiners",
        "--step-time",
        "0.5",
    )
    assert rc == 0, out[-3000:]
    assert summary(out) == (1, 0, 0, 0, 27, 27)
    assert "lost [1]; members [0], state from 0, from step 4" in out
    assert "did not finish the step's collectives" in out


def _network_namespaces_work():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    probe = subprocess.run(["ip", "netns", "add", "ddp-probe"], capture_output=True)
    subprocess.run(["ip", "netns", "del", "ddp-probe"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(
    not _network_namespaces_work(), reason="needs root, iproute2 and network namespaces"
)
def test_host_cut_off_in_network_namespaces():
    # The cut host's collectives time out (10 s), and its worker exits once the store has
    # not answered for 30 s; the others go on without it.
    rc, out = launch("--netns", "--workers", "3", "--steps", "40", "--cut", "2:5")
    assert rc == 0, out[-3000:]
    assert "cut host 2 off the network after step 5" in out
    assert re.search(
        r"lost \[2\]; members \[0, 1\], state from 0, from step [67]", out
    ), out[-3000:]
    assert "[worker 2] error: the store at 10.57.0.254" in out
    assert summary(out) == (1, 0, 0, 0, 39, 39)
