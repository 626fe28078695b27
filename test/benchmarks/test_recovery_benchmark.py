"""python -m benchmarks.recovery on a tiny model, 2 ranks: what it reports, not how fast.

Every path runs with each kill (inside the backward pass, between steps) and its new process,
and is compared with path a replaying its schedule; the steady-step comparison and the call against its collectives run once. The
timings are the benchmark's to report; these check what does not depend on the machine.
"""

import importlib.util
import json
import pathlib
import socket
import subprocess
import sys

import pytest
import torch.distributed as dist

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from benchmarks.recovery.cells import CALL_MODES, GOALS, KILL_IN  # noqa: E402
from benchmarks.recovery.report import markdown, table  # noqa: E402

# What the runs need; the arithmetic of the verdicts needs neither.
MISSING = (
    "in-place reconfiguration: needs torch 2.14 or later"
    if not hasattr(dist, "_reconfigure")
    else "needs torchft 0.2.0 (v2.14.1's venv has it)"
    if importlib.util.find_spec("torchft") is None
    else None
)
runs = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


def run_benchmark(out: pathlib.Path) -> str:
    """Its stdout, on 2 ranks, a tiny model, no torch.compile, with short steady and call parts."""
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
            "--steady-repeats",
            "2",
            "--steady-steps",
            "3",
            "--call-repeats",
            "2",
            "--timeout",
            "30",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("benchmark")
    stdout = run_benchmark(out)
    return stdout, json.loads((out / "recovery_after_lost_rank.json").read_text()), out


@runs
@pytest.mark.parametrize("kill_in", KILL_IN)
@pytest.mark.parametrize("path", ["reconfigure", "new_group", "restart"])
def test_a_path_that_recovers(report, path, kill_in):
    _, data, _ = report
    cell = data["cells"][f"w2-tiny-none-{kill_in}-{path}"]
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
    # The survivor's attempt at the step of the kill is done again (between steps too: it
    # starts the step with the lost replica in its group); in restart, the restart on the join also
    # discards the step the survivor was in, if it was in one when killed.
    assert cell["discarded_attempts"] in ((1, 2) if path == "restart" else (1,))
    assert cell["short_steps"] == 0
    # The reference replays path new_group, so it shares its mistakes; the replicas, each other's not.
    assert cell["replicas_identical"]
    # Two ranks add their gradients in one order, whatever the buckets: bit for bit.
    assert cell["bitwise_equal_to_reference"] and cell["max_abs_diff"] == 0.0
    assert cell["graphs_after_warmup"] == 0  # no torch.compile here
    assert cell["recovery_rss_over_steady"] > 0


@runs
def test_torchft_killed_in_the_backward_pass(report):
    # torchft 0.2.0 on torch 2.14.1: a replica killed inside its backward pass fails the
    # survivors' allreduce in torchft's comm hook, which then fails an assertion; and the
    # reducer, left in the middle of that pass, fails its next forward pass.
    _, data, _ = report
    assert (
        "INTERNAL ASSERT FAILED"
        in data["cells"]["w2-tiny-none-backward-torchft"]["error"]
    )


@runs
def test_torchft_killed_between_steps(report):
    # The survivor's next quorum waits for the lost replica's heartbeat to expire, and leaves
    # it out: no attempt fails. The new process heals from the survivor in its first quorum.
    _, data, _ = report
    cell = data["cells"]["w2-tiny-none-between_steps-torchft"]
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
    # The call's six rounds, as the series' test_collective_rounds_of_a_call counts them; with
    # sync_module_states, one more: a broadcast of the parameters and buffers.
    assert (call["no_sync"]["rounds"], call["sync"]["rounds"]) == (6, 7)
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
    assert table(data) in stdout
    assert (out / "recovery_after_lost_rank.png").read_bytes()[
        :8
    ] == b"\x89PNG\r\n\x1a\n"


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


@runs
def test_a_second_run_keeps_what_the_first_measured(report):
    # What goes on after an interruption: each measurement already in the file is kept.
    _, data, out = report
    stdout = run_benchmark(out)
    assert json.loads((out / "recovery_after_lost_rank.json").read_text()) == data
    kept = [line for line in stdout.splitlines() if "kept from the run of" in line]
    assert (
        len(kept)
        == len(data["cells"]) + len(data["steady"]) + len(data["call"])
        == 2 * 4 + 1 + 1
    )


@runs
def test_markdown_has_a_row_per_measurement(report):
    _, data, _ = report
    rows = [
        line
        for line in markdown(data).splitlines()
        if line.startswith("| ") and "---" not in line
    ]
    headers = 3
    assert len(rows) == headers + len(data["cells"]) + len(data["steady"]) + 2 * len(
        data["call"]
    )
    assert "| 2 | tiny | none | between steps | torchft | " in markdown(data)
