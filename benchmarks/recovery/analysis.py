"""What a run's events say: recovery times, discarded and lost steps, exactness; intervals."""

import math
import os
import statistics
from typing import Dict, List, Optional

import torch

from benchmarks.recovery.cells import SURVIVORS


def analyze(
    events: List[dict],
    spawned: Dict[int, int],
    victim: int,
    detected_at: Optional[int] = None,
) -> dict:
    """Analyze one run with the fault: its times, discarded attempts, RSS, graphs and schedule."""
    kill = next(e for e in events if e["kind"] == "kill")
    completed = [e for e in events if e["kind"] == "step"]
    before = [e for e in completed if e["t"] < kill["t"]]
    # A survivor may still complete the step before the kill's after it: not a recovery.
    after = [e for e in completed if e["t"] > kill["t"] and e["step"] >= kill["step"]]
    survivors = sorted({e["slot"] for e in completed if e["slot"] != victim})
    # The survivors' next completed optimizer step: the last of them to complete one.
    recovered = max(next(e["t"] for e in after if e["slot"] == s) for s in survivors)
    first_join = next(e for e in after if e["slot"] == victim)
    # The steady step: slot 0's, from the second step on (the first compiles), up to the kill.
    slot0 = [e["t"] for e in before if e["slot"] == 0]
    step_times = [(b - a) / 1e9 for a, b in zip(slot0[1:], slot0[2:])]
    steady_rss = statistics.median(
        e["rss_mb"] for e in before if e["slot"] in survivors and e["step"] > 0
    )
    recovery_rss = max(
        e["rss_mb"]
        for e in after
        if e["slot"] in survivors and e["t"] <= first_join["t"]
    )
    # Discarded: a survivor's attempt that its process never completed, or a step that a slot
    # completed again after a restart from an older checkpoint. Lost: a step no replica completed.
    counts: Dict[tuple, int] = {}
    for e in events:
        if e["kind"] in ("attempt", "step") and e["slot"] != victim:
            key = (e["pid"], e["step"])
            counts[key] = counts.get(key, 0) + (1 if e["kind"] == "attempt" else -1)
    discarded = sum(counts.values())
    by_slot: Dict[tuple, int] = {}
    for e in completed:
        by_slot[(e["slot"], e["step"])] = by_slot.get((e["slot"], e["step"]), 0) + 1
    discarded += sum(n - 1 for (slot, _), n in by_slot.items() if slot != victim)
    finals = [e for e in events if e["kind"] == "final"]
    end = max(e["step"] for e in finals)
    # The first step trained without the lost replica: path restart goes back to the last
    # checkpoint, which is before the kill's step where the kill came while it was written.
    left_at = min(
        (e["step"] for e in completed if e.get("generation") == SURVIVORS),
        default=kill["step"],
    )
    # Short: a step whose update averaged fewer replicas' gradients than the run had members
    # then. torchft logs how many it averaged: its lighthouse leaves out a replica that asks
    # for the quorum later than its join timeout, and that replica heals at the next one. In
    # the other paths, a member left out fails the step's collectives: every process that
    # completed a step averaged it.
    world = victim + 1  # the lost replica is the last
    averaged: Dict[
        int, int
    ] = {}  # per step: the replicas whose gradients its update averaged
    for step in {e["step"] for e in completed}:
        of_step = [e for e in completed if e["step"] == step]
        logged = [
            e["participants"] for e in of_step if e.get("participants") is not None
        ]
        averaged[step] = min(logged) if logged else len({e["slot"] for e in of_step})
    members = {
        step: world - 1 if left_at <= step < first_join["step"] else world
        for step in averaged
    }
    # When each survivor left the failed generation: its first failure after the kill (the
    # third survivor of a ring learns of the loss last), or its skipped step.
    failures = {}
    for e in events:
        if e["kind"] == "failed" and e["t"] > kill["t"] and e["slot"] in survivors:
            failures.setdefault(e["slot"], e["t"])
    checks = [e["s"] for e in events if e["kind"] == "membership_checked"]
    shrink = [
        e for e in events if e["kind"] == "entered" and e["generation"] == SURVIVORS
    ]
    return {
        "end": end,
        "kill_to_survivors_step_s": (recovered - kill["t"]) / 1e9,
        "kill_to_last_failure_s": (
            (max(failures.values()) - kill["t"]) / 1e9 if failures else None
        ),
        "kill_to_detection_s": (
            (detected_at - kill["t"]) / 1e9 if detected_at is not None else None
        ),
        "membership_check_s": statistics.median(checks) if checks else None,
        "shrink_synced_module": any(e.get("synced") for e in shrink),
        "new_process_to_first_step_s": (first_join["t"] - spawned[first_join["pid"]])
        / 1e9,
        "left_at": left_at,
        "joined_at": first_join["step"],
        "discarded_attempts": discarded,
        "lost_updates": len(set(range(end)) - {e["step"] for e in completed}),
        "short_steps": sum(averaged[step] < members[step] for step in averaged),
        "steady_step_s": statistics.median(step_times) if step_times else None,
        "steady_rss_mb": steady_rss,
        "recovery_rss_mb": recovery_rss,
        "recovery_rss_over_steady": recovery_rss / steady_rss,
        "graphs_after_warmup": sum(e["graphs_after_warmup"] for e in finals),
        "digests": {str(e["slot"]): e["digest"] for e in finals},
        # Data parallel: every replica ends with the same parameters and Adam state.
        "replicas_identical": len({e["digest"] for e in finals}) == 1,
    }


def compare_finals(run_dir: str, reference_dir: str, world: int) -> dict:
    """Compare the final parameters with the reference's: the largest difference of a
    parameter, and the norm of the difference relative to the reference's: Adam turns a
    rounding difference in a gradient near zero into an update of the other sign, so the
    largest difference can be as large as a few updates.
    """
    diffs, relative = [], []
    for slot in range(world):
        run = torch.load(os.path.join(run_dir, f"final-{slot}.pt"))
        ref = torch.load(os.path.join(reference_dir, f"final-{slot}.pt"))
        diffs.append(max((a - b).abs().max().item() for a, b in zip(run, ref)))
        difference = math.sqrt(
            sum((a - b).double().square().sum().item() for a, b in zip(run, ref))
        )
        relative.append(
            difference / math.sqrt(sum(b.double().square().sum().item() for b in ref))
        )
    return {
        "max_abs_diff": max(diffs),
        "relative_l2_diff": max(relative),
        "parameters_bitwise_equal": max(diffs) == 0.0,
    }


# t quantiles (0.975) by degrees of freedom, for the 95% interval of a mean of a few repeats.
T975 = {
    1: 12.71,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    12: 2.179,
    15: 2.131,
    20: 2.086,
    30: 2.042,
}


def estimate_interval(ratios: List[float]) -> tuple:
    """Return the mean ratio and its 95% interval, from the repeats' ratios (a t-interval of their logs)."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.mean(logs)
    if len(logs) < 2:
        return math.exp(mean), None, None
    t = T975[max(k for k in T975 if k <= len(logs) - 1)]
    half = t * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def judge_interval(low: Optional[float], high: Optional[float], limit: float) -> str:
    """Judge an interval of a ratio against the goal ``limit``."""
    if high is None:
        return "inconclusive"
    return "met" if high <= limit else "not met" if low > limit else "inconclusive"
