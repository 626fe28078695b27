"""What the benchmark measures: its paths, faults and detections, its goals, and a cell's key."""

import dataclasses

# How the survivors go on:
#   reconfigure      one group per process for the whole run, reconfigured in place
#                    (dist._reconfigure); DDP follows with _update_process_group()
#   new_group        destroy and init the default group, then _update_process_group()
#   torchft          torchft 0.2.0's Manager, DistributedDataParallel and Gloo group
#   torchft_nightly  torchft-nightly 2026.10.26, in a venv of its own, on a native Gloo group
#                    that it reconfigures in place
#   restart          every process restarts from a checkpoint, as TorchElastic does
PATHS = ("reconfigure", "new_group", "torchft", "torchft_nightly", "restart")
TORCHFT_PATHS = ("torchft", "torchft_nightly")
# The version of each path's recovery: a run records its path's, and the tables show the
# runs of the version of now only (the file keeps the others). Version 2 of reconfigure and
# new_group: the failed group released at once, the membership checked before each step, and a
# shrink without sync_module_states (issue 32). Version 3: the same recovery on the redesigned
# series (issues 30 and 31), whose call agrees in two collective rounds instead of six.
PATH_VERSIONS = {
    "reconfigure": 3,
    "new_group": 3,
    "torchft": 1,
    "torchft_nightly": 1,
    "restart": 1,
}
# The fault: the last replica SIGKILLed inside its backward pass or between steps, or stopped
# (SIGSTOP) inside its backward pass, a hung process that closes no connection.
KILL_IN = ("backward", "between_steps", "hang")
# Who finds the loss: the agent on the lost process's host, which sees its exit status
# (local_agent); a store-based membership with heartbeats (heartbeat), which also finds a hung
# process or a lost host; the same, and then the lost process is killed, as an agent on its
# host would on the detector's word, which closes its connections where the host is reachable
# (heartbeat_fence); the same, and then each survivor shuts down its group's sockets by hand,
# a stand-in for a Gloo abort and not the recipe (heartbeat_socket_shutdown); torchft's
# lighthouse, torchft's own heartbeats.
DETECTIONS = (
    "local_agent",
    "heartbeat",
    "heartbeat_fence",
    "heartbeat_socket_shutdown",
    "lighthouse",
)
HEARTBEAT_DETECTIONS = ("heartbeat", "heartbeat_fence", "heartbeat_socket_shutdown")
# _update_process_group(sync_module_states=False), then True.
CALL_MODES = ("no_sync", "sync")
GOALS = {
    "steady_over_stock": 1.02,  # the series' steady step over stock DDP's
    "call_over_collectives": 1.5,  # the _update_process_group call over its collectives, timed alone
    "recovery_s_at_4_ranks_1M": 0.5,  # reconfigure's kill to the survivors' next step, median
    "instructions_over_stock": 1.01,  # the series' instructions of a one-rank step over stock's
}
# The generations of a run: everyone, the survivors, everyone again with the new process.
FIRST, SURVIVORS, REJOINED = 1, 2, 3
# What bounds a run before the plan of its last generation says where it ends.
MAX_STEPS = 100000


@dataclasses.dataclass
class Cell:
    """One measurement with a fault: a configuration, the fault, who detects it, and a path."""

    world: int
    size: str
    compile: str
    path: str
    kill_in: str = "backward"
    detection: str = "local_agent"

    @property
    def key(self) -> str:
        return (
            f"w{self.world}-{self.size}-{self.compile}-{self.kill_in}-"
            f"{self.detection}-{self.path}"
        )


def find_detection(path: str, kill_in: str, chosen: str) -> str:
    """Return who detects the loss in a cell: torchft's lighthouse in torchft; heartbeats for
    a hang, which no exit status shows; else ``chosen``."""
    if path in TORCHFT_PATHS:
        return "lighthouse"
    return "heartbeat" if kill_in == "hang" and chosen == "local_agent" else chosen
