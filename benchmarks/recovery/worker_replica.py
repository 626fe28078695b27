"""A process of paths reconfigure, new_group and restart, and of the reference runs (new_group,
no fault): ``python -m benchmarks.recovery.worker_replica``."""

import datetime
import json
import os
import sys
import time
from typing import List

import torch
import torch.distributed as dist
from benchmarks.process_stats import (
    count_compiled_graphs,
    read_peak_rss_mb,
    reset_peak_rss,
)

from benchmarks.recovery import worker
from benchmarks.recovery.cells import MAX_STEPS
from examples.elastic_ddp import reconfigure, release_failed_group, SOLO_UUID
from torch.nn.parallel import DistributedDataParallel


class Replica(worker.Process):
    """Trains with the members of each generation that the driver's plans name."""

    def __init__(self, args):
        super().__init__(args)
        self.step = 0
        self.end = (
            args.steps or MAX_STEPS
        )  # until a generation's plan says where the run ends

    def wrap(self) -> None:
        self.ddp = DistributedDataParallel(self.model)
        self.net = self.compile_net(self.ddp)

    def plan(self, generation: int) -> dict:
        return json.loads(self.store.get(f"plan/{generation}"))

    def checkpoint(self) -> None:
        tmp = self.args.checkpoint + ".tmp"
        torch.save(
            {
                "step": self.step,
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
            },
            tmp,
        )
        os.replace(tmp, self.args.checkpoint)

    def run(self) -> int:
        generation = self.args.first_generation
        if self.args.restarted:
            # Path restart: a process of a restart, from the checkpoint.
            checkpoint = torch.load(self.args.checkpoint)
            self.model.load_state_dict(checkpoint["model"])
            self.optimizer.load_state_dict(checkpoint["optimizer"])
            self.step = checkpoint["step"]
            plan = self.plan(generation)
            self.end = plan.get("end", self.end)
            self.init_group(plan, generation)
            self.wrap()
            graphs = 0
        else:
            self.init_solo_group()
            self.wrap()
            self.run_backward(self.net, 0)
            self.optimizer.zero_grad(set_to_none=True)
            graphs = count_compiled_graphs()
            self.events.log("ready", graphs=graphs)
            plan = None
        while True:
            if plan is None:
                plan = self.plan(generation)
                if self.slot not in plan["members"]:
                    self.events.log("left", step=self.step)
                    return 0
                self.enter(plan, generation)
            failure = None
            try:
                ended = self.train_generation(plan, generation)
            except RuntimeError as e:
                # A collective failed: the lost replica's peer closed its connections, or the
                # group's timeout ended it.
                failure = str(e).splitlines()[0][:200]
            if failure is not None or ended == "lost":
                # Out of the except clause: nothing holds the failed step's Work any more.
                if failure is None:
                    self.events.log("skipped", step=self.step)
                else:
                    self.events.log("failed", step=self.step, error=failure)
                if self.args.path != "restart":
                    release_failed_group(
                        self.ddp, self.slot, generation, self.args.path == "reconfigure"
                    )
                    self.events.log("released", step=self.step)
                self.optimizer.zero_grad(set_to_none=True)
            elif ended == "end":
                break
            generation += 1
            plan = None
        self.finish(self.step, count_compiled_graphs() - graphs)
        dist.destroy_process_group()
        return 0

    def train_generation(self, plan: dict, generation: int) -> str:
        """Train with the members of ``plan`` until the run's end ("end"), the switch to the
        next generation ("switch"), or a loss that the membership key already names before a
        step ("lost"). Raise the RuntimeError of a failed collective."""
        switch_key, admit_key = f"switch/{generation}", f"admit/{generation}"
        lost_key = f"lost/{generation}"
        chooses = plan["members"][0] == self.slot and not self.args.restarted
        while self.step < self.end:
            if chooses and self.store.check([admit_key]):
                # The next boundary: no member has passed it, since none can complete this
                # step before this process starts it, after the switch is set.
                self.store.set(switch_key, str(self.step + 1))
                chooses = False
            if self.store.check([switch_key]):
                switch_at = int(self.store.get(switch_key))
                if switch_at < self.step:
                    raise SystemExit(
                        f"slot {self.slot} saw the switch at step {switch_at} at {self.step}"
                    )
                if switch_at == self.step:
                    return "switch"
            self.die_if_due(self.step)
            if self.args.hold_before_kill_step and self.step == self.args.kill_step:
                self.store.wait(["hold/released"])
            # A loss already known between steps: no attempt that would fail.
            start = time.perf_counter()
            lost = self.store.check([lost_key])
            self.events.log(
                "membership_checked", step=self.step, s=time.perf_counter() - start
            )
            if lost:
                return "lost"
            reset_peak_rss()
            self.events.log("attempt", step=self.step)
            self.train_step(self.net, self.step)
            self.step += 1
            # Before the checkpoint: a step completed and not saved is done again, which
            # the analysis counts as discarded; one saved and not logged would count so too.
            self.events.log(
                "step",
                step=self.step - 1,
                generation=generation,
                rss_mb=read_peak_rss_mb(),
            )
            if self.args.path == "restart" and plan["members"][0] == self.slot:
                self.checkpoint()
        return "end"

    def init_solo_group(self) -> None:
        timeout = datetime.timedelta(seconds=self.args.collective_timeout)
        if self.args.path == "reconfigure":
            # One group for the whole run; its rank names this process in its handles.
            dist.init_process_group(
                "gloo",
                store=dist.PrefixStore("pg", self.store),
                rank=self.slot,
                world_size=self.slot + 1,
                timeout=timeout,
                enable_reconfigure=True,
            )
            self.reconfigure([self.slot], SOLO_UUID + self.slot)
        else:
            dist.init_process_group(
                "gloo",
                store=dist.PrefixStore(f"solo/{self.slot}/{os.getpid()}", self.store),
                rank=0,
                world_size=1,
            )

    def reconfigure(self, members: List[int], uuid: int) -> None:
        reconfigure(self.store, self.slot, members, uuid, self.args.collective_timeout)

    def init_group(self, plan: dict, generation: int) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        prefix = f"pg/{generation}/{plan.get('restart', 0)}"
        # Every member arrives before any connects. Gloo's rendezvous waits only as long as the
        # group's timeout, and a survivor that is not the lost rank's neighbor arrives only when
        # its collective times out: as late, after the kill, as the others' rendezvous ends.
        self.store.set(f"{prefix}/arrived/{self.slot}", "1")
        self.store.wait([f"{prefix}/arrived/{slot}" for slot in plan["members"]])
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(prefix, self.store),
            rank=plan["members"].index(self.slot),
            world_size=len(plan["members"]),
            timeout=datetime.timedelta(seconds=self.args.collective_timeout),
        )

    def enter(self, plan: dict, generation: int) -> None:
        """Join generation ``plan``: the group, DDP, and Adam's state where a process joins."""
        if self.args.path == "reconfigure":
            self.reconfigure(plan["members"], generation)
        else:
            self.init_group(plan, generation)
        src = plan["members"].index(plan["src"])
        # Survivors alone hold the same state: a shrink needs no broadcast of the module.
        sync = bool(plan["joiners"])
        self.ddp._update_process_group(
            dist.group.WORLD, sync_module_states=sync, src=src
        )
        if plan["joiners"]:
            state = [self.optimizer.state_dict()]
            dist.broadcast_object_list(state, src=src)
            self.optimizer.load_state_dict(state[0])
            self.optimizer.zero_grad(set_to_none=True)
            self.step = int(self.store.get(f"switch/{generation - 1}"))
            self.end = self.step + plan["steps_after_join"]
        self.events.log(
            "entered",
            generation=generation,
            members=plan["members"],
            step=self.step,
            synced=sync,
        )


def main(args) -> int:
    return Replica(args).run()


if __name__ == "__main__":
    sys.exit(worker.run(main))
