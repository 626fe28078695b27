"""docs/recovery.md's recipe on Gloo, as a user copies it: 4 ranks, one killed, 3 go on.

The test takes the recipe's code block from the page and runs it: the detector beside the
store (in the test), and 4 workers that beat, train a DDP module on one group reconfigured in
place, and lose rank 3 between steps. The survivors must go on to the last step with the same
parameters, well before the group's 10 s timeout would have let the third of them go.
"""

import datetime
import json
import os
import pathlib
import re
import subprocess
import sys
import threading

import pytest
import torch.distributed as dist

REPO = pathlib.Path(__file__).resolve().parents[2]
WORLD, KILL_STEP, STEPS = 4, 3, 8


def recipe() -> str:
    """Returns the Python block under "The recipe on Gloo" in docs/recovery.md."""
    page = (REPO / "docs" / "recovery.md").read_text()
    section = page[page.index("## The recipe on Gloo") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


WORKER = """
import datetime, hashlib, json, os, signal, sys, threading, time
import torch, torch.nn as nn
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from examples.elastic_ddp import batch, TinyTransformer

exec(sys.argv[1])  # the recipe
uid, world, port, kill_step, steps = map(int, sys.argv[2:7])
connect = lambda: dist.TCPStore(
    "127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60)
)
store, stopped = connect(), threading.Event()
heartbeat = threading.Thread(target=beat, args=(connect(), uid, stopped))
heartbeat.start()
dist.init_process_group(
    "gloo", store=dist.PrefixStore("pg", store), rank=uid, world_size=uid + 1,
    timeout=datetime.timedelta(seconds=10), enable_reconfigure=True,
)
reconfigure(store, uid, list(range(world)), uuid=0)
torch.manual_seed(0)
model = TinyTransformer()
ddp = DistributedDataParallel(model)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()


def train_step(step):
    if step == kill_step:
        # Every member completed the step before; the others go on to this one.
        store.set(f"done/{uid}", "1")
        store.wait([f"done/{m}" for m in range(world)])
        if uid == world - 1:
            store.set("killed_at", str(time.monotonic_ns()))
            os.kill(os.getpid(), signal.SIGKILL)
    inputs, targets = batch(step, uid)
    loss_fn(ddp(inputs).flatten(0, 1), targets.flatten()).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if step == kill_step:
        store.set(f"recovered/{uid}", str(time.monotonic_ns()))


train(store, uid, ddp, optimizer, train_step, 0, steps, 0)
stopped.set()
heartbeat.join()
digest = hashlib.sha256(
    b"".join(p.detach().numpy().tobytes() for p in model.parameters())
).hexdigest()
recovered = int(store.get(f"recovered/{uid}")) - int(store.get("killed_at"))
print(json.dumps({"digest": digest, "recovered_s": recovered / 1e9}), flush=True)
"""


@pytest.mark.skipif(
    not hasattr(dist, "_reconfigure"),
    reason="in-place reconfiguration: needs torch 2.14 or later",
)
def test_the_survivors_go_on_without_the_lost_rank():
    code = recipe()
    namespace: dict = {}
    exec(code, namespace)  # the detector, beside the store
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=60),
    )
    survivors = []
    detector = threading.Thread(
        target=lambda: survivors.extend(
            namespace["detect"](store, 0, list(range(WORLD)))
        )
    )
    detector.start()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, code, str(uid), str(WORLD), str(store.port)]
            + [str(KILL_STEP), str(STEPS)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for uid in range(WORLD)
    ]
    outputs = [p.communicate(timeout=180) for p in procs]
    detector.join(timeout=60)
    assert [p.returncode for p in procs] == [0, 0, 0, -9], [
        e[-2000:] for _, e in outputs
    ]
    assert survivors == [0, 1, 2]
    reports = [json.loads(out) for out, _ in outputs[:-1]]
    assert len({r["digest"] for r in reports}) == 1, reports
    # The heartbeats' timeout (1 s) and a few steps: far from the 10 s of the group's timeout.
    assert max(r["recovered_s"] for r in reports) < 5.0, reports
