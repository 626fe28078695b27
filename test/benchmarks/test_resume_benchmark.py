"""benchmarks/resume_after_membership_change.py on a tiny model: what it reports, not how fast.

The timings themselves are the benchmark's to report; these check that every path runs and is
reported, that the ratios are the paths' own times over path a's, and the compile counts,
which do not depend on the machine.
"""

import importlib.util
import json
import pathlib
import shutil
import subprocess
import sys

import pytest

BENCHMARK = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "resume_after_membership_change.py"
spec = importlib.util.spec_from_file_location("resume_after_membership_change", BENCHMARK)
benchmark = importlib.util.module_from_spec(spec)
spec.loader.exec_module(benchmark)


def run_benchmark(out, *args):
    return subprocess.run(
        [sys.executable, str(BENCHMARK), "--sizes", "tiny", "--backend", "eager", "--restarts", "1",
         "--warmup", "1", "--steady-steps", "2", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("benchmark")
    result = run_benchmark(out, "--worlds", "2", "--repeats", "2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out, result.stdout, json.loads((out / "resume_after_membership_change.json").read_text())


def test_every_path_is_reported(report):
    out, stdout, data = report
    (row,) = data["results"]
    assert (row["world"], row["size"], data["backend"], row["repeats"], row["restarts"]) == (2, "tiny", "eager", 2, 1)
    assert set(row["paths"]) == set(benchmark.PATHS)
    for name, path in row["paths"].items():
        assert path["resume_s"] > 0 and path["first_step_s"] > 0 and path["peak_rss_mb"] > 0, name
        assert path["over_a"] == pytest.approx(path["resume_s"] / row["paths"]["a"]["resume_s"])
        assert path["first_step_over_steady"] == pytest.approx(path["first_step_s"] / row["steady_step_s"])
        # Only the paths that call _update_process_group time the call.
        assert (path["call_us"] is not None) == (name in ("a", "a_sync")), name
        assert f" 2 {row['parameters'] / 1e6:6.1f}M {name:6} " in stdout
    assert (out / "resume_after_membership_change.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_what_compiles_again(report):
    # The module stays the same object in a, a_sync and b, so Dynamo's guards still hold;
    # new module objects (d) and new processes (c) compile their graph again.
    _, _, data = report
    compiled = {name: path["graphs_compiled"] for name, path in data["results"][0]["paths"].items()}
    assert compiled == {"a": 0, "a_sync": 0, "b": 0, "c": 1, "d": 1}


def test_update_adds_to_the_results_in_out(report, tmp_path):
    out, _, data = report
    shutil.copy(out / "resume_after_membership_change.json", tmp_path)
    result = run_benchmark(tmp_path, "--update", "--worlds", "1", "--repeats", "1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    updated = json.loads((tmp_path / "resume_after_membership_change.json").read_text())
    assert [(r["world"], r["repeats"]) for r in updated["results"]] == [(1, 1), (2, 2)]
    assert updated["results"][1] == data["results"][0]
    # Results of another backend are not mixed in.
    result = run_benchmark(tmp_path, "--update", "--worlds", "1", "--backend", "aot_eager")
    assert result.returncode == 2
    assert "was measured with another torch, backend or machine; --update cannot add to it" in result.stderr


def test_summarize_takes_the_slowest_rank_then_the_median_repeat():
    def change(resume_s, call_s=None):
        return {"resume_s": resume_s, "call_s": call_s, "first_step_s": resume_s / 2, "graphs_compiled": 0,
                "peak_rss_mb": 100 * resume_s}

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


def test_refuses_a_torch_without_the_api():
    stock = (
        "import runpy, sys; from torch.nn.parallel import DistributedDataParallel as DDP; "
        "del DDP._update_process_group; sys.argv = [sys.argv[1]]; runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    result = subprocess.run([sys.executable, "-c", stock, str(BENCHMARK)], capture_output=True, text=True)
    assert result.returncode == 2
    assert "has no DistributedDataParallel._update_process_group" in result.stderr
