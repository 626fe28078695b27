"""scripts/gpu-check on a machine without a GPU: its refusals, its plan, and that its cases exist."""

import importlib.util
import subprocess
import sys
import time
import unittest

from conftest import load_script, REPO
from torch_overlay import bases

GPU_CHECK = REPO / "scripts" / "gpu-check"
gpu_check = load_script("gpu-check")


def run(*args):
    return subprocess.run(
        [sys.executable, str(GPU_CHECK), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


UPSTREAM = bases.get("v2.14.1")


def names_in_the_test_file():
    spec = importlib.util.spec_from_file_location(
        "test_ddp_update_process_group", UPSTREAM.test_file(REPO)
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [
        test.id()
        for suite in unittest.TestLoader().loadTestsFromModule(module)
        for test in suite
    ]


def test_every_case_names_tests_of_the_file():
    # unittest's -k matches a substring of "module.Class.test": a pattern that matches
    # nothing would leave a case out without a word.
    names = names_in_the_test_file()
    for case in gpu_check.CASES + tuple(gpu_check.list_fix_cases(UPSTREAM)):
        assert any(case in name for name in names), case

    # Every case that only CUDA runs on one GPU is among them; the NCCL recovery needs a
    # GPU per rank.
    def tests_of(cls):
        return {name.rsplit(".", 1)[1] for name in names if f".{cls}." in name}

    cuda_only = tests_of("UpdateProcessGroupGlooCudaTest") - tests_of(
        "UpdateProcessGroupGlooTest"
    )
    cuda_only.remove("test_recover_after_aborting_the_old_nccl_group")
    selected = [case.rsplit(".", 1)[1] for case in gpu_check.CASES]
    assert cuda_only
    for test in cuda_only:
        assert any(test.startswith(method) for method in selected), test


def test_the_fixes_cases_are_those_the_fix_patches_add():
    cases = [case.rsplit(".", 1)[1] for case in gpu_check.list_fix_cases(UPSTREAM)]
    assert "test_recover_while_collectives_in_flight" in cases
    assert "test_bad_argument_changes_nothing" in cases
    # So are the cases of the harness and of what stock passes, which come first.
    assert "test_shrink_switch_expand" in cases
    # Cases of what the series adds after its fixes are not.
    assert "test_builtin_comm_hook_follows_group" not in cases
    assert "test_reconfigure_generation" not in cases


def test_dry_run_prints_each_step():
    result = run("--dry-run", "--out", "/tmp/gpu-check-out")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 4
    assert all(line.startswith(f"PYTHONPATH={REPO} ") for line in lines)
    assert " -m torch_overlay install --repo " in lines[0] and lines[0].endswith(
        "--base v2.14.1"
    )
    assert all(f"-k {case}" in lines[1] for case in gpu_check.CASES)
    assert "elastic_ddp.py --backend nccl --workers 1" in lines[2]
    assert "--device cuda --paths a" in lines[3] and lines[3].endswith(
        "--out /tmp/gpu-check-out"
    )


def test_dry_run_commands_run_from_any_directory(tmp_path):
    # The overlay step, asked for its status instead: python -m torch_overlay is found.
    overlay = run("--dry-run").stdout.splitlines()[0].replace(" install ", " status ")
    pasted = subprocess.run(
        ["bash", "-c", overlay], cwd=tmp_path, capture_output=True, text=True
    )
    assert "No module named torch_overlay" not in pasted.stderr
    assert pasted.stdout.startswith("torch "), pasted.stderr


def test_dry_run_with_only_the_fixes():
    # What a GPU machine with torch 2.11.0 runs: the fixes and their cases, nothing else.
    result = run("--dry-run", "--fixes-only")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("--base v2.14.1 --fixes-only")
    assert all(f"-k {case}" in lines[1] for case in gpu_check.list_fix_cases(UPSTREAM))


def test_log_keeps_the_output_and_stops_at_the_deadline(tmp_path):
    log = gpu_check.Log(tmp_path / "gpu-check.log")
    # Nothing printed for a while, then something: the log waits for it.
    assert log.run(["sh", "-c", "sleep 1; echo hi; exit 3"], timeout_s=30) == 3
    started = time.monotonic()
    assert (
        log.run(["sh", "-c", "echo before; sleep 60; echo after"], timeout_s=2) is None
    )
    assert time.monotonic() - started < 30
    text = (tmp_path / "gpu-check.log").read_text()
    assert "\nhi\n" in text and "\nbefore\n" in text and "\nafter\n" not in text
    assert "[gpu-check] stopped: it ran past its 2 s" in text


def test_refuses_another_torch_and_no_gpu():
    # This venv holds torch 2.1.2, the base v2.1.2's, and no GPU.
    result = run()
    assert result.returncode == 2
    assert (
        "is not supported by the v2.14.1 series" in result.stderr
        and "pass --base v2.1.2" in result.stderr
    )
    assert "The series' fixes alone do not apply to it either." in result.stderr
    result = run("--base", "v2.1.2")
    assert result.returncode == 2
    assert "sees no CUDA device: gpu-check needs a GPU" in result.stderr
