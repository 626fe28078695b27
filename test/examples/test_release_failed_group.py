"""examples/elastic_ddp.py's release_failed_group: the third survivor of 4 fails at once.

Four Gloo ranks train a DDP module; rank 3 is SIGKILLed between steps, and the others start
the next step. In Gloo's ring only the lost rank's two neighbours see a connection close; the
third survivor waits on a neighbour that is alive. Each survivor releases the failed group as
soon as its step fails, and so the third fails one hop later, not at the group's 10 s timeout
(without the release, it took 10.0 s here). In place, the release reconfigures the group onto
the survivor alone; else it moves DDP onto a group of its own, which lets go of the failed
group, and destroys that: this shows that destroying it closes its connections.
"""

import datetime
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch.distributed as dist

REPO = pathlib.Path(__file__).resolve().parents[2]
WORLD = 4
TIMEOUT_S = 10.0

RANK = """
import datetime, json, os, signal, sys, time
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from examples.elastic_ddp import batch, release_failed_group, TinyTransformer

in_place, rank, world, port, timeout_s = sys.argv[1] == "in_place", *map(int, sys.argv[2:5]), float(sys.argv[5])
store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
torch.set_num_threads(1)
dist.init_process_group(
    "gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world,
    timeout=datetime.timedelta(seconds=timeout_s),
    **({"enable_reconfigure": True} if in_place else {}),  # torch 2.14 or later
)
if in_place:
    store.set(f"handle/{rank}", dist._get_reconfigure_handle())
    handles = [store.get(f"handle/{r}").decode() for r in range(world)]
    dist._reconfigure(uuid=1, handles=handles).wait()
torch.manual_seed(0)
ddp = DistributedDataParallel(TinyTransformer())
loss_fn = nn.CrossEntropyLoss()

def train_step(step):
    inputs, targets = batch(step, rank)
    loss_fn(ddp(inputs).flatten(0, 1), targets.flatten()).backward()
    ddp.zero_grad(set_to_none=True)

train_step(0)
store.set(f"done/0/{rank}", "1")
store.wait([f"done/0/{r}" for r in range(world)])
if rank == world - 1:
    store.set("killed_at", str(time.monotonic_ns()))
    os.kill(os.getpid(), signal.SIGKILL)
store.wait(["killed_at"])
failure = None
try:
    train_step(1)
except RuntimeError as e:
    failure = str(e).splitlines()[0]
failed_at = time.monotonic_ns()
if failure is not None:
    release_failed_group(ddp, rank, 1, in_place)
print(json.dumps({
    "rank": rank,
    "failure": failure,
    "failed_after_s": (failed_at - int(store.get("killed_at"))) / 1e9,
}), flush=True)
store.set(f"reported/{rank}", "1")
store.wait([f"reported/{r}" for r in range(world - 1)])
"""


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(
            "in_place",
            marks=pytest.mark.skipif(
                not hasattr(dist, "_reconfigure"),
                reason="in-place reconfiguration: needs torch 2.14 or later",
            ),
        ),
        "new_group",  # any base: the release of a group that is not reconfigured in place
    ],
)
def test_every_survivor_fails_within_a_second(mode):
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=60),
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, mode, str(rank), str(WORLD), str(store.port)]
            + [str(TIMEOUT_S)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(WORLD)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, -9], [
        e[-2000:] for _, e in outputs
    ]
    reports = [json.loads(out) for out, _ in outputs[:-1]]
    # Every survivor's step failed, the third one too, well before the group's timeout.
    assert all(r["failure"] for r in reports), reports
    assert max(r["failed_after_s"] for r in reports) < 1.0, reports
