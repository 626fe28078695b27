"""scripts/benchmark: which benchmark a base and the flags select."""

import argparse

import pytest
from conftest import load_script

from torch_overlay import bases

benchmark = load_script("benchmark")


def chosen(base, *, resume=False, recovery=False):
    return benchmark.choose_benchmark(
        argparse.Namespace(base=bases.get(base), resume=resume, recovery=recovery)
    )


def test_each_base_runs_its_benchmark():
    assert chosen(bases.ADDS_API) == benchmark.RESUME
    assert chosen(bases.LATEST) == benchmark.RECOVERY


def test_the_flags_choose_over_the_base():
    assert chosen(bases.LATEST, resume=True) == benchmark.RESUME
    assert chosen(bases.LATEST, recovery=True) == benchmark.RECOVERY


def test_recovery_on_a_base_without_reconfiguration_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        chosen(bases.ADDS_API, recovery=True)
    assert exit_info.value.code == 2
    assert (
        f"needs torch 2.14 or later (in-place reconfiguration, torchft); use --base {bases.LATEST}"
        in (capsys.readouterr().err)
    )


def test_the_recovery_benchmark_needs_torchft_nightly_unless_left_out():
    assert benchmark.needs_torchft_nightly([])
    assert benchmark.needs_torchft_nightly(["--paths", "torchft_nightly", "torchft"])
    assert not benchmark.needs_torchft_nightly(["--paths", "reconfigure", "torchft"])
    assert not benchmark.needs_torchft_nightly(["--skip", "recovery", "steady"])
