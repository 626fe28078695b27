"""Start the ranks of each MultiProcessTestCase from a forkserver that has torch imported.

MultiProcessTestCase spawns every rank of every case, and each spawned rank imports torch and
the test tools again: on this project's 2-core machine that is about 8 of the 11 seconds a
Gloo case of 4 ranks takes, and most of CI's time. Here the ranks are forked from a
forkserver instead, a process that imported torch and the test tools once and nothing else:
like a spawned rank, a forked one starts without anything of pytest's process (no thread, no
process group, no CUDA context), and it imports the test file itself. The test files are
upstream's, unchanged: they spawn, as upstream's CI runs them, and
``DDP_UPDATE_PG_START_METHOD=spawn`` runs them so here.

A forkserver's ranks inherit the environment that pytest's process had when the server
started (the first case), not the one it has when each case starts. The cases set their
environment variables in the ranks themselves, so this holds for them.
"""

import os

import torch
from torch.testing._internal.common_distributed import MultiProcessTestCase

START_METHODS = ("forkserver", "spawn")
START_METHOD = os.environ.get("DDP_UPDATE_PG_START_METHOD", "forkserver")
if START_METHOD not in START_METHODS:
    raise ValueError(
        f"DDP_UPDATE_PG_START_METHOD={START_METHOD!r}: expected one of "
        f"{', '.join(START_METHODS)}"
    )

# What every rank imports before the test file. Python 3.11's forkserver does not take
# pytest's sys.path, so the test file itself cannot be among them.
PRELOADED = ["torch.testing._internal.common_distributed", "hypothesis", "expecttest"]


def _start_from_forkserver(self) -> None:
    context = torch.multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOADED)
    self._start_processes(context.Process)


if START_METHOD == "forkserver":
    MultiProcessTestCase._spawn_processes = _start_from_forkserver
