"""What the benchmark measures: its paths, where the kill comes, its goals, and a cell's key."""

import dataclasses

# How the survivors go on:
#   reconfigure  one group per process for the whole run, reconfigured in place
#                (dist._reconfigure); DDP follows with _update_process_group()
#   new_group    destroy and init the default group, then _update_process_group()
#   torchft      torchft 0.2.0's Manager, DistributedDataParallel and Gloo group
#   restart      every process restarts from a checkpoint, as TorchElastic does
PATHS = ("reconfigure", "new_group", "torchft", "restart")
KILL_IN = ("backward", "between_steps")
# _update_process_group(sync_module_states=False), then True.
CALL_MODES = ("no_sync", "sync")
GOALS = {
    "steady_over_stock": 1.02,  # the series' steady step over stock DDP's
    "call_over_collectives": 1.5,  # the _update_process_group call over its collectives, timed alone
}
# The generations of a run: everyone, the survivors, everyone again with the new process.
FIRST, SURVIVORS, REJOINED = 1, 2, 3
# What bounds a run before the plan of its last generation says where it ends.
MAX_STEPS = 100000


@dataclasses.dataclass
class Cell:
    """One measurement with a fault: a configuration, where the kill comes, and a path."""

    world: int
    size: str
    compile: str
    path: str
    kill_in: str = "backward"

    @property
    def key(self) -> str:
        return f"w{self.world}-{self.size}-{self.compile}-{self.kill_in}-{self.path}"
