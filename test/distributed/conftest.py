"""Start the ranks of each MultiProcessTestCase from a forkserver that has torch imported.

MultiProcessTestCase spawns every rank of every case, and each spawned rank imports torch and
the test tools again: on this project's 2-core machine that was about 10 of the 11 seconds a
Gloo case of 4 ranks took, and most of CI's time. Under pytest (scripts/test, CI) the ranks
are forked from a forkserver instead: a process that imported torch and a few of the modules
the test files import, once. Like a spawned rank, a forked one starts with nothing of pytest's
process (no process group, no state the test file set at run time) and imports the test file
itself. The test files are upstream's, unchanged: they spawn, as upstream's CI runs them, and
so do they run as scripts (``python test_ddp_update_process_group.py``, as scripts/gpu-check
runs them), where this file is not loaded; ``DDP_UPDATE_PG_START_METHOD=spawn`` spawns them
under pytest too.

What the server imports must leave CUDA usable in a forked rank: torch.testing's common_utils
calls ``torch.cuda.is_available()`` when imported, after which a forked process cannot
initialize CUDA, so the ranks import it themselves. Importing torch starts one native thread
in the server, which the forks do not take with them.

A forkserver's ranks inherit the environment that pytest's process had when the server
started (the first case), not the one it has when each case starts; the cases set their
environment variables inside the ranks. And 2.14's ``_spawn_processes()`` also makes "spawn"
the process-wide start method, which this one does not: every test that starts processes
itself names its context.
"""

import os

import torch
from torch.testing._internal.common_distributed import MultiProcessTestCase

START_METHODS = ("forkserver", "spawn")
START_METHOD = os.environ.get("DDP_UPDATE_PG_START_METHOD") or "forkserver"
if START_METHOD not in START_METHODS:
    raise ValueError(
        f"DDP_UPDATE_PG_START_METHOD={START_METHOD!r}: expected one of "
        f"{', '.join(START_METHODS)}"
    )

# Python 3.11's forkserver does not take pytest's sys.path, so the test file itself cannot be
# among them; an import that fails there is skipped silently
# (test/scripts/test_distributed_conftest.py checks that the server has torch).
PRELOADED = [
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "torch._dynamo",
    "hypothesis",
    "expecttest",
]


def _start_from_forkserver(self) -> None:
    self._start_processes(torch.multiprocessing.get_context("forkserver").Process)


if START_METHOD == "forkserver":
    torch.multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOADED)
    MultiProcessTestCase._spawn_processes = _start_from_forkserver
