"""python -m benchmarks.recovery on a tiny model, 2 ranks: what it reports, not how fast.

Every path but torchft-nightly runs with each kill (inside the backward pass, between steps)
and its new process, once, and is compared with path new_group replaying its schedule; the
steady-step comparison and the call against its collectives run once. Two more invocations
run reconfigure alone: a hung replica, which the heartbeats detect; and a kill between steps
whose loss is published before the survivors start the next step. The timings are the
benchmark's to report; these check what does not depend on the machine, and bounds far from
what was measured.
"""

import importlib.util
import json
import pathlib
import socket
import subprocess
import sys

import pytest
import torch.distributed as dist

from benchmarks.recovery.cells import CALL_MODES, GOALS
from benchmarks.recovery.driver import TORCHFT_NIGHTLY_VENV
from benchmarks.recovery.report import render_markdown

REPO = pathlib.Path(__file__).resolve().parents[2]

# What the runs need; the arithmetic of the verdicts needs neither.
MISSING = (
    "in-place reconfiguration: needs torch 2.14 or later"
    if not hasattr(dist, "_reconfigure")
    else "needs torchft 0.2.0 (v2.14.1's venv has it)"
    if importlib.util.find_spec("torchft") is None
    else None
)
runs = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
KILLS = ("backward", "between_steps")
PATHS = ("reconfigure", "new_group", "torchft", "restart")
COLLECTIVE_TIMEOUT_S = 10.0


def run_benchmark(out: pathlib.Path, *options: str) -> str:
    """Returns its stdout, on 2 ranks, a tiny model, no torch.compile, one run a cell."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.recovery",
            "--worlds",
            "2",
            "--sizes",
            "tiny",
            "--compile",
            "none",
            "--runs",
            "1",
            "--timeout",
            "30",
            "--out",
            str(out),
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


# With short steady and call parts, and no instruction count (valgrind takes minutes).
MAIN_OPTIONS = (
    "--paths",
    *PATHS,
    "--kill-in",
    *KILLS,
    "--steady-repeats",
    "2",
    "--steady-steps",
    "3",
    "--call-repeats",
    "2",
    "--collective-timeout",
    str(COLLECTIVE_TIMEOUT_S),
    "--skip",
    "instructions",
)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("benchmark")
    stdout = run_benchmark(out, *MAIN_OPTIONS)
    return stdout, json.loads((out / "recovery_after_lost_rank.json").read_text()), out


def only_run(data: dict, key: str, failed: bool = False) -> dict:
    """Return the one run of cell ``key``, which failed or did not, as ``failed`` says."""
    (run,) = data["cells"][key]["runs"]
    assert ("error" in run) == failed, f"{key}: {run.get('error', 'no error')}"
    return run


@runs
@pytest.mark.parametrize("kill_in", KILLS)
@pytest.mark.parametrize("path", ["reconfigure", "new_group", "restart"])
def test_a_path_that_recovers(report, path, kill_in):
    _, data, _ = report
    cell = only_run(data, f"w2-tiny-none-{kill_in}-local_agent-{path}")
    assert (
        cell["kill_to_survivors_step_s"] > 0 and cell["new_process_to_first_step_s"] > 0
    )
    # restart goes back to the last checkpoint: the step before the kill's, where the kill
    # came while it was written.
    assert (
        cell["left_at"] in ((4, 5) if path == "restart" else (5,))
        and cell["lost_updates"] == 0
    )
    assert cell["joined_at"] > cell["left_at"] and cell["end"] == cell["joined_at"] + 5
    # The survivor's attempt at the step of the kill is done again. Between steps, it may
    # find the loss published before it starts the step, and then makes no attempt. In
    # restart, the restart on the join also discards the step the survivor was in, if it was
    # in one when killed.
    discarded = {
        "restart": (1, 2),
        "backward": (1,),
        "between_steps": (0, 1),
    }["restart" if path == "restart" else kill_in]
    assert cell["discarded_attempts"] in discarded
    assert cell["short_steps"] == 0
    # The reference replays path new_group, so it shares its mistakes; the replicas, each
    # other's not.
    assert cell["replicas_identical"]
    # Two ranks add their gradients in one order, whatever the buckets: bit for bit.
    assert cell["bitwise_equal_to_reference"] and cell["max_abs_diff"] == 0.0
    assert cell["graphs_after_warmup"] == 0  # no torch.compile here
    assert cell["recovery_rss_over_steady"] > 0
    if path != "restart":
        # The survivor failed at once, released the group, and shrank without broadcasting
        # the module, which it holds as every survivor does.
        if cell["discarded_attempts"]:
            assert cell["kill_to_last_failure_s"] < 1.0
        assert cell["shrink_synced_module"] is False
        # A store round trip before each step: far below a millisecond here.
        assert cell["membership_check_s"] < 1e-3


@runs
def test_torchft_killed_in_the_backward_pass(report):
    # torchft 0.2.0 on torch 2.14.1: a replica killed inside its backward pass fails the
    # survivors' allreduce in torchft's comm hook, which then fails an assertion; and the
    # reducer, left in the middle of that pass, fails its next forward pass.
    _, data, _ = report
    run = only_run(data, "w2-tiny-none-backward-lighthouse-torchft", failed=True)
    assert "INTERNAL ASSERT FAILED" in run["error"]


@runs
def test_torchft_killed_between_steps(report):
    # The survivor's next quorum waits for the lost replica's heartbeat to expire, and leaves
    # it out: no attempt fails. The new process heals from the survivor in its first quorum.
    _, data, _ = report
    cell = only_run(data, "w2-tiny-none-between_steps-lighthouse-torchft")
    assert (
        cell["kill_to_survivors_step_s"] > 0 and cell["new_process_to_first_step_s"] > 0
    )
    assert (cell["left_at"], cell["lost_updates"], cell["discarded_attempts"]) == (
        5,
        0,
        0,
    )
    # One survivor of two is not a majority: the lighthouse waits for it, it is never left out.
    assert cell["short_steps"] == 0
    assert cell["joined_at"] > cell["left_at"] and cell["end"] == cell["joined_at"] + 5
    assert cell["replicas_identical"]
    # torchft divides the sum by the participants; DDP multiplies each gradient by 1/2, then
    # sums. With two ranks both are exact: the same bits.
    assert cell["bitwise_equal_to_reference"] and cell["max_abs_diff"] == 0.0


@runs
def test_steady_and_call(report):
    stdout, data, out = report
    steady = data["steady"]["w2-tiny-none"]
    assert steady["repeats"] == 2 and steady["verdict"] in (
        "met",
        "not met",
        "inconclusive",
    )
    low, high = steady["interval_95"]
    assert low <= steady["series_over_stock"] <= high
    assert steady["torchft_step_s"] > 0
    call = data["call"]["w2-tiny"]
    # The call's two rounds (rank 0's description, every rank's verdict), as the series'
    # test_collective_rounds_of_a_call counts them; with sync_module_states, one more: a
    # broadcast of the parameters and buffers.
    assert (call["no_sync"]["rounds"], call["sync"]["rounds"]) == (2, 3)
    assert sorted(c["kind"] for c in call["sync"]["collectives"]) == sorted(
        [c["kind"] for c in call["no_sync"]["collectives"]] + ["broadcast"]
    )
    for mode in (call[name] for name in CALL_MODES):
        assert mode["call_over_collectives"] == pytest.approx(
            mode["call_s"] / mode["collectives_s"]
        )
        assert mode["met"] == (
            mode["call_over_collectives"] <= GOALS["call_over_collectives"]
        )
    assert render_markdown(data) in stdout
    assert (out / "recovery_after_lost_rank.png").read_bytes()[
        :8
    ] == b"\x89PNG\r\n\x1a\n"


@runs
def test_a_second_run_keeps_what_the_first_measured(report):
    # What goes on after an interruption: each measurement already in the file is kept.
    _, data, out = report
    stdout = run_benchmark(out, *MAIN_OPTIONS)
    assert json.loads((out / "recovery_after_lost_rank.json").read_text()) == data
    kept = [line for line in stdout.splitlines() if "kept" in line]
    assert (
        len(kept)
        == len(data["cells"]) + len(data["steady"]) + len(data["call"])
        == len(KILLS) * len(PATHS) + 1 + 1
    )


@runs
def test_markdown_has_a_row_per_measurement(report):
    _, data, _ = report
    rows = [
        line
        for line in render_markdown(data).splitlines()
        if line.startswith("| ") and "---" not in line
    ]
    # The recovery table, the goals (a row per fault), the steady step, the call.
    headers = 4
    assert len(rows) == headers + len(data["cells"]) + len(KILLS) + len(
        data["steady"]
    ) + 2 * len(data["call"])
    assert (
        "| 2 | tiny | none | killed between steps | lighthouse | torchft | 1 | "
        in render_markdown(data)
    )


@runs
def test_a_hung_replica_costs_the_collective_timeout(tmp_path):
    # Stopped in its backward pass, the replica closes no connection: the heartbeats find it
    # lost after their timeout (1 s), and the survivor's collective ends at the group's
    # timeout, as nothing aborts a Gloo collective in torch 2.14.1.
    timeout_s = 3.0
    run_benchmark(
        tmp_path,
        *("--paths", "reconfigure", "--kill-in", "hang"),
        *("--collective-timeout", str(timeout_s), "--skip", "steady", "call"),
        "instructions",
    )
    data = json.loads((tmp_path / "recovery_after_lost_rank.json").read_text())
    cell = only_run(data, "w2-tiny-none-hang-heartbeat-reconfigure")
    heartbeat_timeout_s = data["heartbeat"]["timeout_s"]
    assert heartbeat_timeout_s - 0.2 < cell["kill_to_detection_s"] < timeout_s
    assert timeout_s - 0.5 < cell["kill_to_last_failure_s"]
    assert cell["kill_to_survivors_step_s"] < timeout_s + 5
    assert cell["lost_updates"] == 0 and cell["bitwise_equal_to_reference"]


@runs
def test_a_loss_known_before_the_step_costs_no_attempt(tmp_path):
    # The survivor waits before the kill's step until the driver has published the loss: it
    # finds the membership key and goes on without the lost replica, with nothing to discard.
    # Without the check it would start the step, fail and discard it.
    run_benchmark(
        tmp_path,
        *("--paths", "reconfigure", "--kill-in", "between_steps"),
        *("--hold-survivors-at-the-kill", "--skip", "steady", "call", "instructions"),
    )
    data = json.loads((tmp_path / "recovery_after_lost_rank.json").read_text())
    cell = only_run(data, "w2-tiny-none-between_steps-local_agent-reconfigure")
    assert cell["discarded_attempts"] == 0 and cell["lost_updates"] == 0
    assert cell["kill_to_last_failure_s"] is None  # no step failed
    assert cell["bitwise_equal_to_reference"]


@pytest.mark.skipif(
    not (TORCHFT_NIGHTLY_VENV / "bin" / "python").exists(),
    reason=f"torchft-nightly: needs {TORCHFT_NIGHTLY_VENV.name} (scripts/benchmark "
    "--torchft-nightly)",
)
@runs
def test_torchft_nightly_survives_a_kill_in_the_backward_pass(tmp_path):
    # Its comm hook gives DDP the bucket unchanged where the allreduce failed, and the step
    # is not committed: the survivor goes on.
    run_benchmark(
        tmp_path,
        *("--paths", "torchft_nightly", "--kill-in", "backward"),
        *("--skip", "steady", "call", "instructions"),
    )
    data = json.loads((tmp_path / "recovery_after_lost_rank.json").read_text())
    cell = only_run(data, "w2-tiny-none-backward-lighthouse-torchft_nightly")
    assert cell["lost_updates"] == 0 and cell["bitwise_equal_to_reference"]


def test_a_process_records_the_error_that_ends_it(tmp_path):
    # A replica whose driver's store is not there: it records why it failed, for the driver.
    with socket.socket() as unused:
        unused.bind(("localhost", 0))
        port = unused.getsockname()[1]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.recovery.worker_replica",
            "--slot",
            "0",
            "--world",
            "1",
            "--size",
            "tiny",
            "--port",
            str(port),
            "--events",
            str(tmp_path),
            "--timeout",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode != 0
    recorded = list(tmp_path.glob("error-*.txt"))
    assert (
        len(recorded) == 1 and "Error" in recorded[0].read_text().split(":")[0]
    ), result.stderr[-2000:]
