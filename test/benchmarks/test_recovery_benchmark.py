"""benchmarks/recovery_after_lost_rank.py on a tiny model, 2 ranks: what it reports, not how fast.

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

BENCHMARK = (
    pathlib.Path(__file__).resolve().parents[2]
    / "benchmarks"
    / "recovery_after_lost_rank.py"
)
spec = importlib.util.spec_from_file_location("recovery_after_lost_rank", BENCHMARK)
benchmark = importlib.util.module_from_spec(spec)
spec.loader.exec_module(benchmark)

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
            str(BENCHMARK),
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
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("benchmark")
    stdout = run_benchmark(out)
    return stdout, json.loads((out / "recovery_after_lost_rank.json").read_text()), out


@runs
@pytest.mark.parametrize("kill_in", benchmark.KILL_IN)
@pytest.mark.parametrize("path", ["a_reconfigure", "a", "c"])
def test_a_path_that_recovers(report, path, kill_in):
    _, data, _ = report
    cell = data["cells"][f"w2-tiny-none-{kill_in}-{path}"]
    assert (
        cell["kill_to_survivors_step_s"] > 0 and cell["new_process_to_first_step_s"] > 0
    )
    # c's restart goes back to the last checkpoint: the step before the kill's, where the kill
    # came while it was written.
    assert (
        cell["left_at"] in ((4, 5) if path == "c" else (5,))
        and cell["lost_updates"] == 0
    )
    assert cell["joined_at"] > cell["left_at"] and cell["end"] == cell["joined_at"] + 5
    # The survivor's attempt at the step of the kill is done again (between steps too: it
    # starts the step with the lost replica in its group); in c, the restart on the join also
    # discards the step the survivor was in, if it was in one when killed.
    assert cell["discarded_attempts"] in ((1, 2) if path == "c" else (1,))
    assert cell["short_steps"] == 0
    # The reference replays path a, so it shares a's mistakes; the replicas, each other's not.
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
    for mode in (call[name] for name in benchmark.CALL_MODES):
        assert mode["call_over_collectives"] == pytest.approx(
            mode["call_s"] / mode["collectives_s"]
        )
        assert mode["met"] == (
            mode["call_over_collectives"] <= benchmark.GOALS["call_over_collectives"]
        )
    assert benchmark.table(data) in stdout
    assert (out / "recovery_after_lost_rank.png").read_bytes()[
        :8
    ] == b"\x89PNG\r\n\x1a\n"


def test_interval_and_verdict():
    mean, low, high = benchmark.interval([1.0, 1.0, 1.0])
    assert (mean, low, high) == (1.0, 1.0, 1.0)
    assert benchmark.verdict(0.99, 1.01, 1.02) == "met"
    assert benchmark.verdict(1.03, 1.05, 1.02) == "not met"
    assert benchmark.verdict(1.0, 1.05, 1.02) == "inconclusive"
    assert benchmark.verdict(None, None, 1.02) == "inconclusive"


def test_a_step_short_of_a_member():
    # 4 replicas; the last is killed at step 5 and its new process first steps at 8. The
    # survivors' steps 5 to 7 average 3 of 3. At 8, slot 0 asks for the quorum too late and is
    # left out (it heals past 8: the step is short, not lost); at 9, slot 3. At 10 every replica
    # logs the step but torchft says it averaged 3: its count wins over the slots'.
    events, t = [], 0

    def pid(slot):
        return 200 if slot == 3 and t > 100 else 100 + slot

    def step(step, slots, participants):
        nonlocal t
        for slot in slots:
            t += 1
            events.append(
                {
                    "kind": "step",
                    "t": t,
                    "slot": slot,
                    "pid": pid(slot),
                    "step": step,
                    "participants": participants,
                    "rss_mb": 100.0,
                }
            )

    for s in range(5):
        step(s, range(4), 4)
    t += 1
    events.append({"kind": "kill", "t": t, "step": 5, "slot": 3})
    for s in range(5, 8):
        step(s, range(3), 3)
    t = 101  # the new process
    step(8, (1, 2, 3), 3)
    step(9, range(3), 3)
    step(10, range(4), 3)
    events += [
        {
            "kind": "final",
            "t": t + 1,
            "slot": slot,
            "pid": pid(slot),
            "step": 11,
            "digest": "d",
            "graphs_after_warmup": 0,
        }
        for slot in range(4)
    ]
    cell = benchmark.analyze(events, {200: 90}, victim=3)
    assert (cell["joined_at"], cell["lost_updates"], cell["short_steps"]) == (8, 0, 3)


def test_a_failure_names_its_exception_not_the_lines_after_it(tmp_path):
    # DDP's error for a reduction left unfinished goes on for lines after the exception's
    # first one, and ends with a hint; the cell's failure must name the exception.
    driver = object.__new__(benchmark.Driver)
    driver.events_dir = str(tmp_path)
    pathlib.Path(driver.stderr_path(1)).write_text(
        "Traceback (most recent call last):\n"
        '  File "recovery_after_lost_rank.py", line 178, in train_step\n'
        "[rank0]: RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one.\n"
        "Parameter indices which did not receive grad for rank 0: 0 1\n"
        " In addition, you can set the environment variable TORCH_DISTRIBUTED_DEBUG to either INFO or DETAIL\n"
    )
    assert driver.last_error(1).startswith(
        "[rank0]: RuntimeError: Expected to have finished reduction"
    )
    # SystemExit's message names no exception: the last line.
    pathlib.Path(driver.stderr_path(2)).write_text(
        "slot 1 saw the switch at step 3 at 4\n"
    )
    assert driver.last_error(2) == "slot 1 saw the switch at step 3 at 4"
    # What the process recorded wins over its stderr, where torchft logs the errors it handles.
    pathlib.Path(driver.stderr_path(3)).write_text(
        "Traceback (most recent call last):\nRuntimeError: handled by torchft\nslot 1 is at step 9, past the end at 8\n"
    )
    pathlib.Path(benchmark.error_path(driver.events_dir, 3)).write_text(
        "SystemExit: slot 1 is at step 9, past the end at 8"
    )
    assert driver.last_error(3) == "SystemExit: slot 1 is at step 9, past the end at 8"


def test_a_process_records_the_error_that_ends_it(tmp_path):
    # A replica whose driver's store is not there: it records why it failed, for the driver.
    with socket.socket() as unused:
        unused.bind(("localhost", 0))
        port = unused.getsockname()[1]
    result = subprocess.run(
        [
            sys.executable,
            str(BENCHMARK),
            "--role",
            "replica",
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
        for line in benchmark.markdown(data).splitlines()
        if line.startswith("| ") and "---" not in line
    ]
    headers = 3
    assert len(rows) == headers + len(data["cells"]) + len(data["steady"]) + 2 * len(
        data["call"]
    )
    assert "| 2 | tiny | none | between steps | torchft | " in benchmark.markdown(data)
