"""benchmarks/resume_after_membership_change.py on a tiny model: what it reports, not how fast.

The timings themselves are the benchmark's to report; these check that every path runs and is
reported, that the ratios are the paths' own times over path a's, the compile counts, which do
not depend on the machine, and that the goals are computed from the results and reported, not
asserted.
"""

import importlib.util
import json
import pathlib
import subprocess
import sys
import tempfile

import pytest
import torch._dynamo.config

from benchmarks import resume_report

BENCHMARK = (
    pathlib.Path(__file__).resolve().parents[2]
    / "benchmarks"
    / "resume_after_membership_change.py"
)
spec = importlib.util.spec_from_file_location(
    "resume_after_membership_change", BENCHMARK
)
benchmark = importlib.util.module_from_spec(spec)
spec.loader.exec_module(benchmark)


def run_benchmark(out, *args):
    return subprocess.run(
        [
            sys.executable,
            str(BENCHMARK),
            "--sizes",
            "tiny",
            "--backend",
            "eager",
            "--restarts",
            "1",
            "--warmup",
            "1",
            "--steady-steps",
            "2",
            "--out",
            str(out),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("benchmark")
    result = run_benchmark(out, "--worlds", "2", "--repeats", "2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return (
        out,
        result.stdout,
        json.loads((out / "resume_after_membership_change.json").read_text()),
    )


def test_every_path_is_reported(report):
    out, stdout, data = report
    (row,) = data["results"]
    assert (
        row["world"],
        row["size"],
        data["backend"],
        row["repeats"],
        row["restarts"],
    ) == (2, "tiny", "eager", 2, 1)
    assert set(row["paths"]) == set(resume_report.PATHS)
    for name, path in row["paths"].items():
        assert (
            path["resume_s"] > 0
            and path["first_step_s"] > 0
            and path["peak_rss_mb"] > 0
        ), name
        assert path["over_a"] == pytest.approx(
            path["resume_s"] / row["paths"]["a"]["resume_s"]
        )
        assert path["first_step_over_steady"] == pytest.approx(
            path["first_step_s"] / row["steady_step_s"]
        )
        assert path["overhead_s"] == pytest.approx(
            path["resume_s"] - row["steady_step_s"]
        )
        assert path["peak_rss_over_steady"] == pytest.approx(
            path["peak_rss_mb"] / row["steady_peak_rss_mb"]
        )
        # Only the paths that call _update_process_group time the call.
        assert (path["call_us"] is not None) == (name in ("a", "a_sync")), name
        assert f" 2 {row['parameters'] / 1e6:6.1f}M {name:6} " in stdout
    assert row["steady_peak_rss_mb"] > 0
    assert (out / "resume_after_membership_change.png").read_bytes()[
        :8
    ] == b"\x89PNG\r\n\x1a\n"


def test_the_goals_are_reported_after_the_table(report):
    _, stdout, data = report
    assert data["goals"] == resume_report.judge_goals(data["results"])
    assert [g["met"] is None for g in data["goals"]] == [
        False,
        True,
        False,
        False,
    ]  # one size: no growth
    table_end = stdout.index(resume_report.format_table(data["results"])) + len(
        resume_report.format_table(data["results"])
    )
    assert stdout[table_end:].startswith(
        "\n" + resume_report.format_goals(data["goals"]) + "\n"
    )


def test_what_compiles_again(report):
    # The module stays the same object in a, a_sync and b, so Dynamo's guards still hold;
    # new processes (c) compile their graph again, and so do new module objects (d) where
    # Dynamo guards on the module object. Where it inlines nn modules
    # (inline_inbuilt_nn_modules, the default in later releases than 2.1), the guards
    # hold for a new module of the same structure too.
    _, _, data = report
    compiled = {
        name: path["graphs_compiled"]
        for name, path in data["results"][0]["paths"].items()
    }
    new_module_compiles = (
        0 if getattr(torch._dynamo.config, "inline_inbuilt_nn_modules", False) else 1
    )
    assert compiled == {"a": 0, "a_sync": 0, "b": 0, "c": 1, "d": new_module_compiles}


def without_the_steady_peak_rss(data):
    """``data`` as the benchmark wrote it before it measured the steady state's peak RSS."""
    older = json.loads(json.dumps(data))
    del older["goals"]
    for row in older["results"]:
        del row["steady_peak_rss_mb"]
        for path in row["paths"].values():
            del path["overhead_s"], path["peak_rss_over_steady"]
    return older


def test_update_adds_to_the_results_in_out(report, tmp_path):
    _, _, data = report
    # The results it adds to may be older than the steady state's peak RSS and the goals.
    older = without_the_steady_peak_rss(data)
    (tmp_path / "resume_after_membership_change.json").write_text(json.dumps(older))
    result = run_benchmark(tmp_path, "--update", "--worlds", "1", "--repeats", "1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    updated = json.loads((tmp_path / "resume_after_membership_change.json").read_text())
    assert [(r["world"], r["repeats"]) for r in updated["results"]] == [(1, 1), (2, 2)]
    assert updated["results"][1] == older["results"][0]
    assert updated["goals"] == resume_report.judge_goals(updated["results"])
    assert updated["goals"][-1]["detail"].endswith(
        ", of 1 configurations; n/a for 1 older entries"
    )
    assert resume_report.format_goals(updated["goals"]) in result.stdout
    # Adding to results that have their goals (another key than the machine's) works too.
    result = run_benchmark(tmp_path, "--update", "--worlds", "1", "--repeats", "1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # Results of another backend are not mixed in.
    result = run_benchmark(
        tmp_path, "--update", "--worlds", "1", "--backend", "aot_eager"
    )
    assert result.returncode == 2
    assert (
        "was measured with another torch, backend or machine; --update cannot add to it"
        in result.stderr
    )


def test_summarize_takes_the_slowest_rank_then_the_median_repeat():
    def change(resume_s, call_s=None):
        return {
            "resume_s": resume_s,
            "call_s": call_s,
            "first_step_s": resume_s / 2,
            "graphs_compiled": 0,
            "peak_rss_mb": 100 * resume_s,
        }

    per_rank = [
        [change(1.0, 1e-4), change(5.0, 3e-4), change(2.0, 2e-4)],
        [change(3.0, 4e-4), change(1.0, 5e-4), change(2.5, 6e-4)],
    ]
    summary = benchmark.summarize(per_rank)
    assert summary["resume_s"] == 3.0  # the slowest ranks: 3.0, 5.0, 2.5
    assert summary["first_step_s"] == 1.5
    assert summary["peak_rss_mb"] == 300
    assert summary["call_us"] == pytest.approx(350)  # the median of every rank's calls
    assert summary["repeats"] == 3


def result(
    world, size, parameters, call_us, first_step_over_steady, peak_rss_over_steady=None
):
    """A configuration as measure() reports it, path a only; without peak_rss_over_steady, as
    written before the benchmark measured the steady state's peak RSS."""
    a = {
        "resume_s": 0.1,
        "call_us": call_us,
        "first_step_s": 0.1,
        "graphs_compiled": 0,
        "peak_rss_mb": 500.0,
        "repeats": 3,
        "first_step_over_steady": first_step_over_steady,
        "over_a": 1.0,
    }
    row = {
        "world": world,
        "size": size,
        "parameters": parameters,
        "repeats": 3,
        "restarts": 2,
        "steady_step_s": 0.1,
        "paths": {"a": a},
    }
    if peak_rss_over_steady is not None:
        a.update(overhead_s=0.0, peak_rss_over_steady=peak_rss_over_steady)
        row["steady_peak_rss_mb"] = a["peak_rss_mb"] / peak_rss_over_steady
    return row


def test_goals_from_hand_made_results():
    results = [
        result(2, "1M", 1_000_000, 600, 1.01, 1.02),
        result(2, "100M", 100_000_000, 850, 1.04, 1.04),
        result(
            2, "10M", 10_000_000, 700, 1.02
        ),  # an older entry: no peak_rss_over_steady
        result(4, "1M", 1_000_000, 500, 1.00, 1.01),
        result(4, "100M", 100_000_000, 1200, 1.30, 1.20),
        {
            "world": 4,
            "size": "10M",
            "error": "the rank processes exited with [-9, 0, 0, 0]",
        },
    ]
    summary = resume_report.judge_goals(results)
    assert [(g["goal"], g["met"]) for g in summary] == [
        ("path a's call <= 1000 us at every size and world", False),
        ("2 ranks: path a's call at the largest size <= 1.5x the smallest's", True),
        ("4 ranks: path a's call at the largest size <= 1.5x the smallest's", False),
        ("path a's first step / steady step <= 1.05 at every size and world", False),
        ("path a's peak RSS / steady state's <= 1.05 at every size and world", False),
    ]
    details = [g["detail"] for g in summary]
    assert (
        details[0]
        == "max 1200 us at 4 ranks 100M, of 5 configurations; over: 4 ranks 100M (1200 us)"
    )
    assert (
        details[1] == "100M 850 us / 1M 600 us = 1.42x"
    )  # by parameters, not by the order of results
    assert details[2] == "100M 1200 us / 1M 500 us = 2.40x"
    assert details[4] == (
        "max 1.200 at 4 ranks 100M, of 4 configurations; over: 4 ranks 100M (1.200); "
        "n/a for 1 older entries"
    )
    text = resume_report.format_goals(summary)
    assert text.splitlines()[1] == f"  NOT MET {summary[0]['goal']}: {details[0]}"
    assert text.splitlines()[2].startswith("  met     2 ranks")

    # The configurations within the goals: one world has a single size, so no growth for it.
    summary = resume_report.judge_goals(results[:4])
    assert [(g["goal"].split(":")[0], g["met"]) for g in summary] == [
        ("path a's call <= 1000 us at every size and world", True),
        ("2 ranks", True),
        ("path a's first step / steady step <= 1.05 at every size and world", True),
        ("path a's peak RSS / steady state's <= 1.05 at every size and world", True),
    ]
    # Only older entries: the peak RSS goal cannot be judged; one size per world: nor can the growth.
    older = [
        result(2, "1M", 1_000_000, 600, 1.01),
        result(4, "1M", 1_000_000, 900, 1.10),
    ]
    summary = resume_report.judge_goals(older)
    assert [g["met"] for g in summary] == [True, None, False, None]
    assert summary[1]["detail"] == "one size per world measured"
    assert (
        summary[3]["detail"] == "no configuration measured it (2 older entries lack it)"
    )
    assert resume_report.judge_goals([]) and all(
        g["met"] is None for g in resume_report.judge_goals([])
    )


def test_the_table_shows_na_for_older_entries():
    def every_path(row):
        a = row["paths"]["a"]
        row["paths"] = {
            name: {**a, "call_us": a["call_us"] if name in ("a", "a_sync") else None}
            for name in resume_report.PATHS
        }
        return row

    older = every_path(result(2, "1M", 1_056_256, 680, 0.94))
    newer = every_path(result(4, "1M", 1_056_256, 700, 1.0, 1.02))
    lines = resume_report.format_table([older, newer]).splitlines()
    assert (
        len(lines) == 1 + 2 * len(resume_report.PATHS) + 1
    )  # the header, the paths, what the columns are
    # world, params, path, resume s, x a, the overhead, ..., the peak RSS over the steady state's
    for line in lines[1 : 1 + len(resume_report.PATHS)]:
        assert line.split()[5] == "n/a" and line.split()[-1] == "n/a", line
    for line in lines[1 + len(resume_report.PATHS) : -1]:
        assert line.split()[5] == "0.0" and line.split()[-1] == "1.02", line
    assert max(len(line) for line in lines) <= 88


def test_refuses_a_torch_without_the_api():
    stock = (
        "import runpy, sys; from torch.nn.parallel import DistributedDataParallel as DDP; "
        "del DDP._update_process_group; sys.argv = [sys.argv[1]]; runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    result = subprocess.run(
        [sys.executable, "-c", stock, str(BENCHMARK)], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "has no DistributedDataParallel._update_process_group" in result.stderr


def test_path_a_alone():
    # What a GPU machine runs, --device cuda aside: path a only, no restarted processes.
    with tempfile.TemporaryDirectory() as tmp:
        result = run_benchmark(tmp, "--worlds", "1", "--repeats", "1", "--paths", "a")
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        data = json.loads(
            (pathlib.Path(tmp) / "resume_after_membership_change.json").read_text()
        )
    (row,) = data["results"]
    assert (
        set(row["paths"]) == {"a"}
        and row["restarts"] == 0
        and row["group_backend"] == "gloo"
    )
    assert (data["device"], data["gpu"]) == ("cpu", None)
    assert "restart" not in result.stdout and "CUDA" not in resume_report.format_table(
        data["results"]
    )


def test_bad_paths_and_devices():
    result = run_benchmark("/nonexistent", "--paths", "b")
    assert result.returncode == 2 and "--paths must include a" in result.stderr
    result = run_benchmark("/nonexistent", "--group-backend", "nccl")
    assert (
        result.returncode == 2
        and "--group-backend nccl needs --device cuda" in result.stderr
    )
    if not torch.cuda.is_available():
        result = run_benchmark("/nonexistent", "--device", "cuda")
        assert (
            result.returncode == 2
            and "--device cuda: torch sees no CUDA device" in result.stderr
        )


def test_cuda_memory_is_reported_where_measured():
    # A configuration as measure() reports it on CUDA, path a only.
    row = result(1, "10M", 10_000_000, 400, 1.01, 1.01)
    row["paths"]["a"].update(peak_cuda_mb=250.0, peak_cuda_over_steady=1.25)
    row["steady_peak_cuda_mb"] = 200.0
    lines = resume_report.format_table([row]).splitlines()
    assert lines[0].endswith("CUDA MB CUDA/st")
    assert lines[1].split()[-2:] == ["250", "1.25"]
    assert lines[-1].endswith("; CUDA: peak memory allocated")
    goal = resume_report.judge_goals([row])[-1]
    assert (goal["goal"], goal["met"]) == (
        "path a's peak CUDA memory / steady state's <= 1.05 at every size and world",
        False,
    )
    # Without CUDA figures, no CUDA goal and no CUDA columns.
    assert "CUDA" not in resume_report.format_goals(
        resume_report.judge_goals([result(1, "10M", 10_000_000, 400, 1.0, 1.0)])
    )
