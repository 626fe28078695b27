"""benchmarks/update_process_group_scale.py: the call's rounds and payloads on a simulated world."""

import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def run(tmp_path, *arguments) -> list:
    output = tmp_path / "scale.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.update_process_group_scale",
            *arguments,
            "--output",
            str(output),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(output.read_text())["rows"]


def test_two_rounds_and_payloads_that_grow_with_the_verdicts_alone(tmp_path):
    rows = run(
        tmp_path, "--ranks", "8", "2048", "--parameters", "5000", "--repeats", "1"
    )
    for row in rows:
        kinds = [c["kind"] for c in row["collectives"]]
        # Rank 0's description, every rank's verdict, and the broadcast of the module's
        # states where sync_module_states asks for it.
        expected = ["broadcast", "allgather"]
        if row["sync_module_states"]:
            expected.append("broadcast")
        assert kinds == expected, row
        description, verdicts = row["collectives"][:2]
        # A fixed description, and a verdict of a fixed size from each rank: what a rank
        # receives grows with the ranks, not with the parameters.
        assert description["received"] < 1024
        assert verdicts["sent"] < 1024
        assert verdicts["received"] == verdicts["sent"] * row["ranks"]
    largest = next(
        r for r in rows if r["ranks"] == 2048 and not r["sync_module_states"]
    )
    assert largest["received_bytes"] < 1_000_000
