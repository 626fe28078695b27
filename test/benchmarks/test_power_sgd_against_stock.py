"""PowerSGD for a job that never calls _update_process_group(): the series changes nothing.

The same training runs twice in one venv, on the wheel's own files (stock, through
benchmarks/recovery/stock_torch.py) and with the series: the gradients of every step, bit
for bit, and the iteration counts must agree, over a run that spans the warm-up.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from benchmarks.recovery import stock_torch

REPO = pathlib.Path(__file__).resolve().parents[2]

# Two ranks, each on its own data, so that the allreduces of P and Q and of the
# uncompressed tensors pair across processes as a job's do.
WORLD_SIZE = 2
RUN = """
import hashlib, json, os, sys
kind, rank, world_size, store_path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if kind == "stock":
    from benchmarks.recovery import stock_torch
    stock_torch.use_stock_files()
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

store = dist.FileStore(store_path, world_size)
dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)
)
# One bucket: the hook waits for a collective inside a callback, which Gloo's two
# threads run, so more buckets than threads can wait for each other.
ddp = DistributedDataParallel(model)
state = powerSGD_hook.PowerSGDState(
    process_group=None, start_powerSGD_iter=3, min_compression_rate=0.1
)
ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
data = torch.Generator().manual_seed(rank)
steps = []
for step in range(8):
    optimizer.zero_grad()
    ddp(torch.randn(4, 16, generator=data)).pow(2).sum().backward()
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.grad.numpy().tobytes())
    steps.append([step, state.iter, len(state.error_dict), digest.hexdigest()])
    optimizer.step()
print(json.dumps(steps), flush=True)
# Exit without tearing the group down: stock 2.14.1's Gloo teardown (destroy_process_group(),
# or the exit after it) once ended a rank of this test with std::terminate in a clean-clone CI
# run ("terminate called without an active exception"). Once every rank has said through the
# store that its steps are done, every collective has completed on every rank, and nothing is
# in flight on the group's connections.
store.set(f"done/{rank}", "1")
store.wait([f"done/{r}" for r in range(world_size)])
os._exit(0)
"""


def run(kind: str, tmp_path: pathlib.Path) -> list:
    """Train on WORLD_SIZE ranks of ``kind`` (stock or series); return each rank's steps."""
    env = dict(os.environ)
    command = stock_torch.make_command(env) if kind == "stock" else [sys.executable]
    # The stock process (python -S) skips site-packages, where this package is installed:
    # it imports benchmarks from the repository.
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    store = tmp_path / f"{kind}-store"
    ranks = [
        subprocess.Popen(
            [*command, "-c", RUN, kind, str(rank), str(WORLD_SIZE), str(store)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(WORLD_SIZE)
    ]
    outputs = []
    try:
        for process in ranks:
            outputs.append(process.communicate(timeout=300))
            if process.returncode != 0:
                break
    finally:
        # A rank that failed leaves its peer waiting in a collective: end it.
        for process in ranks:
            process.kill()
    steps = []
    for process, (out, err) in zip(ranks, outputs):
        assert process.returncode == 0, err[-3000:]
        steps.append(json.loads(out.splitlines()[-1]))
    return steps


@pytest.mark.skipif(
    not hasattr(torch.nn.parallel.DistributedDataParallel, "_update_process_group"),
    reason="this torch has no _update_process_group",
)
def test_power_sgd_steps_are_stock_s_bit_for_bit(tmp_path):
    stock, series = run("stock", tmp_path), run("series", tmp_path)
    for rank_steps in series:
        # The run spans the warm-up: it compresses, with error feedback, from step 3 on.
        assert [s[1] for s in rank_steps] == list(range(1, 9))
        assert rank_steps[-1][2] > 0
    # The ranks trained on different data and agree: their gradients were averaged.
    assert series[0] == series[1]
    assert series == stock
