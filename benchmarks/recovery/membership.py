"""A store-based membership: who of a generation's members still beats.

Each member adds 1 to ``beats/SLOT`` in the store every heartbeat period (worker.Heartbeat).
The detector, which runs beside the store (in the benchmark, in the driver), reads the counts
every period, and takes a member whose count has not changed for the heartbeat timeout as lost:
a process that died, one that hangs (SIGSTOP stops its heartbeat thread too), or one on a host
that the network lost. It needs no exit status, unlike the local agent. A member is watched
from its first beat on.
"""

import time
from typing import Callable, Dict, List, Optional, Tuple


class HeartbeatDetector:
    """Finds the members of ``slots`` whose heartbeats stopped."""

    def __init__(
        self,
        store,
        slots: List[int],
        period_s: float,
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.store, self.slots, self.clock = store, slots, clock
        self.period_s, self.timeout_s = period_s, timeout_s
        self.seen: Dict[int, Tuple[int, float]] = {}  # slot -> (count, when it changed)
        self.read_at: Optional[float] = None

    def find_lost(self) -> List[int]:
        """Return the members whose count has not changed for the timeout; read the counts
        at most once a period."""
        now = self.clock()
        if self.read_at is None or now - self.read_at >= self.period_s:
            self.read_at = now
            for slot in self.slots:
                count = int(self.store.add(f"beats/{slot}", 0))
                if count and self.seen.get(slot, (None,))[0] != count:
                    self.seen[slot] = (count, now)
        return [
            slot
            for slot, (_, changed) in self.seen.items()
            if now - changed > self.timeout_s
        ]
