"""benchmarks/recovery/stock_torch.py: a process started with ``python -S`` runs the wheel's own files."""

import json
import os
import pathlib
import subprocess
import sys

import torch.nn.parallel.distributed as series_distributed
from benchmarks.recovery import stock_torch

REPO = pathlib.Path(__file__).resolve().parents[2]
# What a process reports of its DDP module. python -S skips site-packages, and with them the
# installed package: the process imports benchmarks from the repository, put on its path here.
REPORT = f"""
import json, sys
sys.path.insert(0, {str(REPO)!r})
from benchmarks.recovery import stock_torch
stock_torch.use_stock_files()
import torch.nn.parallel.distributed as distributed
print(json.dumps({{
    "file": distributed.__file__,
    "code_file": distributed.DistributedDataParallel.forward.__code__.co_filename,
    "attributes": sorted(vars(distributed.DistributedDataParallel)),
    "overlay_imported": stock_torch.PACKAGE in sys.modules,
}}))
"""


def stock_report() -> dict:
    env = dict(os.environ)
    command = stock_torch.make_command(env)
    result = subprocess.run(
        [*command, "-c", REPORT], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def test_a_stock_process_runs_the_original_files_under_their_installed_names():
    stock = stock_report()
    assert not stock["overlay_imported"]
    # The original source, with what the series adds missing from it.
    added = set(vars(series_distributed.DistributedDataParallel)) - set(
        stock["attributes"]
    )
    assert added, "the stock process's DDP has everything the series' has"
    # Under the installed file's name: Dynamo chooses how to trace a function by its file's name,
    # and traced DDP's forward as a user's function from the backup's, which broke torch.compile.
    assert stock["file"] == stock["code_file"] == series_distributed.__file__


def test_without_python_s_it_refuses():
    env = dict(os.environ)
    env[stock_torch.SITE_PACKAGES_ENV] = "unused"
    result = subprocess.run(
        [sys.executable, "-c", REPORT],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert (
        "stock torch needs python -S: the overlay's .pth file has already run"
        in result.stderr
    )
