"""Every script answers --help, scripts/overlay refuses a venv with another torch, and a
leftover .venv is named when a base's venv is made."""

import pathlib
import subprocess
import sys

import pytest

from conftest import fake_command, load_script

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "script", ["overlay", "test", "demo", "mutants", "apply", "build", "submit", "lint"]
)
def test_scripts_have_help(script):
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / script), "--help"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: scripts/{script}")


@pytest.mark.parametrize(
    "version, message",
    [
        ("2.13.0", "has DistributedDataParallel._update_process_group upstream"),
        ("2.0.1", "needs torch 2.1.x"),
    ],
)
def test_overlay_install_refuses_a_venv_with_other_torch(tmp_path, version, message):
    # A stand-in venv whose python reports that torch version, and would fail at anything else.
    fake_command(tmp_path / "venv" / "bin", "python", f"echo {version}")
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "overlay"),
            "install",
            "--base",
            "v2.1.2",
            "--venv",
            str(tmp_path / "venv"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert f"torch {version} " in result.stderr and message in result.stderr


def test_a_leftover_dot_venv_is_named_when_a_venv_is_made(tmp_path):
    common = load_script("overlay")._common
    old, new = tmp_path / ".venv", tmp_path / ".venv-v2.1.2"
    assert common.describe_old_venv(new, old) == ""
    fake_command(old / "bin", "python")
    note = common.describe_old_venv(new, old)
    assert f"{old} is not used any more" in note and f"Creating {new};" in note
    # --venv .venv: the user's choice.
    assert common.describe_old_venv(old, old) == ""
