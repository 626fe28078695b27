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

# One rank: what the series changes in the hook is the order of its own steps, not the
# collectives' pairing.
RUN = """
import hashlib, json, sys
if sys.argv[1] == "stock":
    from benchmarks.recovery import stock_torch
    stock_torch.use_stock_files()
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
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
steps = []
for step in range(8):
    optimizer.zero_grad()
    ddp(torch.randn(4, 16)).pow(2).sum().backward()
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.grad.numpy().tobytes())
    steps.append([step, state.iter, len(state.error_dict), digest.hexdigest()])
    optimizer.step()
print(json.dumps(steps))
"""


def run(kind: str) -> list:
    env = dict(os.environ)
    command = stock_torch.make_command(env) if kind == "stock" else [sys.executable]
    # The stock process (python -S) skips site-packages, where this package is installed:
    # it imports benchmarks from the repository.
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [*command, "-c", RUN, kind],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.skipif(
    not hasattr(torch.nn.parallel.DistributedDataParallel, "_update_process_group"),
    reason="this torch has no _update_process_group",
)
def test_power_sgd_steps_are_stock_s_bit_for_bit():
    stock, series = run("stock"), run("series")
    # The run spans the warm-up: it compresses, with error feedback, from step 3 on.
    assert [s[1] for s in series] == list(range(1, 9))
    assert series[-1][2] > 0
    assert series == stock
