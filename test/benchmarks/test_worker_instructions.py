"""benchmarks/recovery/worker_instructions.py: --time-check times the check that DDP's forward makes."""

import argparse
from unittest import mock

import pytest
import torch
import torch.distributed as dist
from benchmarks.recovery import worker_instructions
from benchmarks.recovery.worker import make_batch
from torch.nn.parallel import DistributedDataParallel

CHECK = worker_instructions.CHECK
TINY = argparse.Namespace(size="tiny")

# The series checks its group in forward where torch reconfigures a group in place (2.14).
needs_the_check = pytest.mark.skipif(
    not hasattr(dist, "_reconfigure"),
    reason=f"torch {torch.__version__} has no in-place reconfigure, so the series adds no check",
)


@needs_the_check
def test_the_timed_check_is_the_one_every_forward_makes():
    ddp, _, _ = worker_instructions.build("tiny")
    try:
        inputs, _ = make_batch(0, 0)
        original = getattr(DistributedDataParallel, CHECK)
        with mock.patch.object(
            DistributedDataParallel, CHECK, autospec=True, side_effect=original
        ) as check, torch.no_grad():
            for _ in range(2):
                ddp(inputs)
        assert check.call_count == 2
    finally:
        dist.destroy_process_group()


@needs_the_check
def test_it_reports_a_time_for_a_call_of_the_check():
    result = worker_instructions.time_check(TINY, number=1000)
    # A call of a few microseconds, measured above an empty statement's.
    assert 0 < result["check_s"] < 1e-3, result
    assert not dist.is_initialized()


def test_without_the_check_it_says_so_and_leaves_no_group(monkeypatch):
    monkeypatch.delattr(DistributedDataParallel, CHECK, raising=False)
    for _ in range(2):
        assert worker_instructions.time_check(TINY, number=10) == {
            "check_s": None,
            "why": f"this DDP has no {CHECK}()",
        }
    assert not dist.is_initialized()
