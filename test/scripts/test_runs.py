"""scripts/_runs.py, the runs of scripts/test: which failures run again, and that the summary names each
failure and rerun."""

import pathlib
import re
import sys

import pytest

from conftest import load_helper

runs = load_helper("_runs")

# What MultiProcessTestCase reports when Gloo's full mesh breaks while a rank makes a group,
# as CI printed it on torch 2.11.0 (the paths shortened).
CONNECT_FAILED = """Process 2 exited with error code 10 and exception:
Traceback (most recent call last):
  File "torch/testing/_internal/common_distributed.py", line 705, in run_test
    getattr(self, test_name)()
  File "test/distributed/test_ddp_update_process_group.py", line 339, in _split
    groups = [dist.new_group(half) for half in halves]
  File "torch/distributed/distributed_c10d.py", line 5384, in _new_group_with_tag
    pg, pg_store = _new_process_group_helper(
                   ^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "torch/distributed/distributed_c10d.py", line 2087, in _new_process_group_helper
    backend_class = ProcessGroupGloo(
                    ^^^^^^^^^^^^^^^^^
RuntimeError: Gloo connectFullMesh failed with [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:547] \
Connection closed by peer [127.0.0.1]:58503
"""
# The same on torch 2.1.2: its frames and its Gloo path.
CONNECT_FAILED_2_1 = """Process 1 exited with error code 10 and exception:
Traceback (most recent call last):
  File "torch/distributed/distributed_c10d.py", line 3944, in _new_group_with_tag
    pg, pg_store = _new_process_group_helper(
  File "torch/distributed/distributed_c10d.py", line 1264, in _new_process_group_helper
    backend_class = ProcessGroupGloo(backend_prefix_store, group_rank, group_size, timeout=timeout)
RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:598] \
Connection closed by peer [127.0.0.1]:40001
"""
# The transport error in a collective: a peer that died, which a test may be about.
PEER_GONE = """Process 1 exited with error code 10 and exception:
Traceback (most recent call last):
  File "test/distributed/test_ddp_update_process_group.py", line 500, in test_x
    dist.all_reduce(t)
RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4242
"""
# One rank's own error while it makes a group, and its peer's lost connection in a collective:
# together they hold both halves of CONNECT_FAILED, but no rank failed to connect.
TWO_RANKS = (
    """Process 0 exited with error code 10 and exception:
Traceback (most recent call last):
  File "torch/distributed/distributed_c10d.py", line 2087, in _new_process_group_helper
    backend_class = ProcessGroupGloo(
ValueError: the new group's ranks are wrong

"""
    + PEER_GONE
)
TIMED_OUT = "Process 1 terminated or timed out after 300.09866404533386 seconds"
FAILURES = {
    "connect_failed": CONNECT_FAILED,
    "connect_failed_2_1": CONNECT_FAILED_2_1,
    "peer_gone": PEER_GONE,
    "two_ranks": TWO_RANKS,
    "timed_out": TIMED_OUT,
}


@pytest.fixture(autouse=True)
def no_rerun_delay(monkeypatch):
    monkeypatch.setattr(runs, "RERUN_DELAY_S", 0)


def execute(tmp_path: pathlib.Path, suite: pathlib.Path):
    toy = runs.Run("toy", pathlib.Path(sys.executable), [str(suite)], cwd=tmp_path)
    toy.execute(runs._common.make_venv_env(venv=pathlib.Path(sys.prefix)))
    return toy


def outcomes(toy):
    return {name.rsplit(".", 1)[1]: outcome for name, outcome in toy.outcomes.items()}


def last_line(message):
    return message.splitlines()[-1]


@pytest.mark.parametrize("name", FAILURES)
def test_the_pattern(name):
    matches = (
        re.search(runs.GLOO_CONNECT_FAILED, f"RuntimeError: {FAILURES[name]}")
        is not None
    )
    assert matches == name.startswith("connect_failed")


def test_only_a_group_that_could_not_connect_runs_again(tmp_path, capsys):
    # Every test fails with its message on its first run, and passes after.
    lines = ["import pathlib", ""]
    for name, message in FAILURES.items():
        marker = tmp_path / f"{name}.ran"
        lines += [
            f"def test_{name}():",
            f"    if not pathlib.Path({str(marker)!r}).exists():",
            f"        pathlib.Path({str(marker)!r}).touch()",
            f"        raise RuntimeError({message!r})",
            "",
        ]
    suite = tmp_path / "test_flaky.py"
    suite.write_text("\n".join(lines))
    toy = execute(tmp_path, suite)
    assert outcomes(toy) == {
        "test_connect_failed": "passed",
        "test_connect_failed_2_1": "passed",
        "test_peer_gone": "failed",
        "test_two_ranks": "failed",
        "test_timed_out": "failed",
    }
    assert toy.failure_log == [
        {
            "test": "test_flaky.py::test_connect_failed",
            "outcome": "rerun",
            "cause": last_line(CONNECT_FAILED),
        },
        {
            "test": "test_flaky.py::test_connect_failed_2_1",
            "outcome": "rerun",
            "cause": last_line(CONNECT_FAILED_2_1),
        },
        {
            "test": "test_flaky.py::test_peer_gone",
            "outcome": "failed",
            "cause": last_line(PEER_GONE),
        },
        {
            "test": "test_flaky.py::test_two_ranks",
            "outcome": "failed",
            "cause": last_line(PEER_GONE),
        },
        {
            "test": "test_flaky.py::test_timed_out",
            "outcome": "failed",
            "cause": f"RuntimeError: {TIMED_OUT}",
        },
    ]
    assert runs.summarize([toy]) == 3
    out = capsys.readouterr().out
    assert (
        f"  rerun test_flaky.py::test_connect_failed: {last_line(CONNECT_FAILED)}\n"
        in out
    )
    assert f"  failed test_flaky.py::test_timed_out: RuntimeError: {TIMED_OUT}\n" in out
    assert out.endswith("2 passed, 3 failed, 0 skipped, 2 reruns\n")


def test_a_failure_on_every_run_fails(tmp_path):
    suite = tmp_path / "test_broken.py"
    suite.write_text(
        f"def test_broken():\n    raise RuntimeError({CONNECT_FAILED!r})\n"
    )
    toy = execute(tmp_path, suite)
    assert outcomes(toy) == {"test_broken": "failed"}
    assert [entry["outcome"] for entry in toy.failure_log] == [
        "rerun"
    ] * runs.RERUNS + ["failed"]


def test_the_summary_names_the_slowest_tests(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(runs, "SLOWEST", 2)
    suite = tmp_path / "test_timed.py"
    suite.write_text(
        "import time\n\n"
        "def test_quick():\n    pass\n\n"
        "def test_slow():\n    time.sleep(0.3)\n\n"
        "def test_slower():\n    time.sleep(0.6)\n"
    )
    toy = execute(tmp_path, suite)
    assert sorted(toy.durations, key=toy.durations.get) == [
        f"test_timed.{name}" for name in ("test_quick", "test_slow", "test_slower")
    ]
    runs.summarize([toy])
    slowest = [
        line.split(": ", 1)[1]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("  slowest")
    ]
    assert slowest == ["test_timed.test_slower", "test_timed.test_slow"]


def test_no_test_found_is_an_error_unless_the_run_allows_it(tmp_path):
    suite = tmp_path / "test_empty.py"
    suite.write_text("# upstream's cases, commented out\n")
    toy = runs.Run("toy", pathlib.Path(sys.executable), [str(suite)], cwd=tmp_path)
    env = runs._common.make_venv_env(venv=pathlib.Path(sys.prefix))
    with pytest.raises(SystemExit):
        toy.execute(env)
    toy.may_collect_none = True
    toy.execute(env)
    assert toy.outcomes == {}
