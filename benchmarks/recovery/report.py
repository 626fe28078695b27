"""The results file as text: the table printed after a run and the Markdown of
docs/benchmark.md, with the goals; each cell as the median and range of its runs."""

import statistics
from typing import Callable, Dict, List, Optional

from benchmarks.model import SIZES

from benchmarks.recovery import results
from benchmarks.recovery.cells import CALL_MODES, GOALS, KILL_IN, PATHS, TORCHFT_PATHS

FAULTS = {
    "backward": "killed in backward",
    "between_steps": "killed between steps",
    "hang": "hangs in backward",
}
DETECTION_NAMES = {
    "local_agent": "local agent",
    "heartbeat": "heartbeats",
    "heartbeat_fence": "heartbeats, then the lost process killed",
    "heartbeat_socket_shutdown": "heartbeats, then sockets shut down (not the recipe)",
    "lighthouse": "lighthouse",
}


def order_config(key: str) -> tuple:
    """Return the sort key of a configuration: by world, then model size, then the rest
    (compile mode, where the kill came), so that w2-10M-none sorts after w2-1M-inductor.
    """
    world, size, *rest = key.split("-")
    return int(world[1:]), list(SIZES).index(size), rest


def order_cell(key: str) -> tuple:
    """Return the sort key of a cell: its configuration, fault, detection, then path."""
    world, size, compile_mode, kill_in, detection, path = key.split("-")
    return (
        order_config(f"{world}-{size}-{compile_mode}"),
        KILL_IN.index(kill_in),
        detection,
        PATHS.index(path),
    )


def format_seconds(values: List[float]) -> str:
    """Format times as their median and, for more than one, their range."""
    if not values:
        return "n/a"
    median = f"{statistics.median(values):.2f}"
    if len(values) == 1:
        return median
    return f"{median} ({min(values):.2f} to {max(values):.2f})"


def format_counts(values: List[int]) -> str:
    """Format counts as one value, or their range where the runs differ."""
    return (
        f"{min(values)}"
        if min(values) == max(values)
        else f"{min(values)} to {max(values)}"
    )


def format_exactness(runs: List[dict]) -> str:
    """Format the comparison with the reference of every run."""
    bitwise = sum(r["bitwise_equal_to_reference"] for r in runs)
    if bitwise == len(runs):
        return "bitwise"
    worst = max(runs, key=lambda r: r["max_abs_diff"])
    detail = f"at most {worst['max_abs_diff']:.1e}" + (
        f", relative L2 {worst['relative_l2_diff']:.1e}"
        if "relative_l2_diff" in worst
        else ""
    )
    return (
        f"bitwise in {bitwise} of {len(runs)}; else {detail}"
        if bitwise
        else f"no: {detail}"
    )


def escape_error(error: str, length: int = 160) -> str:
    """Return an error's first characters, for a cell of a Markdown table."""
    return error[:length].replace("|", "\\|")


def select_completed_runs(runs: List[dict]) -> List[dict]:
    return [r for r in runs if "error" not in r]


def collect_field(runs: List[dict], name: str) -> list:
    """Return the runs' values of ``name``, leaving out the runs that lack it."""
    return [r[name] for r in runs if r.get(name) is not None]


def format_recovery_rows(data: dict) -> List[str]:
    """Format the cells of now as the rows of the recovery table."""
    rows = []
    for key in sorted(data["cells"], key=order_cell):
        runs = results.select_current_runs(data, key)
        if not runs:
            continue
        world, size, compile_mode, kill_in, detection, path = key.split("-")
        row = (
            f"| {world[1:]} | {size} | {compile_mode} | {FAULTS[kill_in]} | "
            f"{DETECTION_NAMES[detection]} | {path} |"
        )
        done = select_completed_runs(runs)
        failed = [r for r in runs if "error" in r]
        ran = f"{len(runs)}" + (
            f", {len(failed)} failed: {escape_error(failed[0]['error'], 120)}"
            if failed
            else ""
        )
        if not done:
            rows.append(f"{row} {ran} |" + " |" * 9)
            continue
        short = collect_field(done, "short_steps")
        rows.append(
            f"{row} {ran} | {format_seconds(collect_field(done, 'kill_to_survivors_step_s'))} | "
            f"{format_seconds(collect_field(done, 'kill_to_last_failure_s'))} | "
            f"{format_seconds(collect_field(done, 'new_process_to_first_step_s'))} | "
            f"{format_counts(collect_field(done, 'discarded_attempts'))} | "
            f"{format_counts(collect_field(done, 'lost_updates'))} | "
            f"{format_counts(short) if len(short) == len(done) else 'n/c'} | "
            f"{format_exactness(done)} | "
            f"{max(collect_field(done, 'recovery_rss_over_steady')):.2f} | "
            f"{format_counts(collect_field(done, 'graphs_after_warmup'))} |"
        )
    return rows


RECOVERY_HEADER = [
    "| world | size | compile | fault | detection | path | runs | kill → survivors' next step, s "
    "| kill → last survivor's failure, s | new process → its first step, s | discarded "
    "| lost | short of a member | equal to the reference | RSS in recovery / steady, largest "
    "| graphs after warm-up |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
    "| --- | --- |",
]


def compute_median_recovery(data: dict, key: str) -> Optional[float]:
    """Return the median recovery of cell ``key`` where every run of now completed."""
    runs = results.select_current_runs(data, key)
    if not runs or len(select_completed_runs(runs)) < len(runs):
        return None
    return statistics.median(r["kill_to_survivors_step_s"] for r in runs)


def format_goal_rows(data: dict) -> List[str]:
    """Format, per configuration and fault, reconfigure against each torchft and the goals."""
    rows = []
    faults = sorted(
        {key.rsplit("-", 2)[0] for key in data["cells"]},
        key=lambda k: (order_config(k), KILL_IN.index(k.rsplit("-", 1)[1])),
    )
    for fault in faults:
        detection = "heartbeat" if fault.endswith("-hang") else "local_agent"
        ours_key = f"{fault}-{detection}-reconfigure"
        runs = results.select_current_runs(data, ours_key)
        if not runs:
            continue
        ours = compute_median_recovery(data, ours_key)
        world, size, compile_mode, kill_in = fault.split("-")
        cells = [
            f"{format_seconds(collect_field(select_completed_runs(runs), 'kill_to_survivors_step_s'))}"
        ]
        verdicts = []
        for path in TORCHFT_PATHS:
            theirs_runs = results.select_current_runs(
                data, f"{fault}-lighthouse-{path}"
            )
            theirs = compute_median_recovery(data, f"{fault}-lighthouse-{path}")
            if not theirs_runs:
                cells.append("not run")
            elif theirs is None:
                done = len(select_completed_runs(theirs_runs))
                cells.append(
                    f"did not complete ({done} of {len(theirs_runs)} runs did)"
                )
            else:
                cells.append(
                    format_seconds(
                        collect_field(theirs_runs, "kill_to_survivors_step_s")
                    )
                )
                verdicts.append(ours is not None and ours <= theirs)
        at_most = (
            (
                "yes"
                if ours is not None and ours <= GOALS["recovery_s_at_4_ranks_1M"]
                else "**no**"
            )
            if (world, size) == ("w4", "1M")
            else "n/a"
        )
        done = select_completed_runs(runs)
        exact = (
            "yes"
            if done
            and len(done) == len(runs)
            and all(
                r["lost_updates"] == 0 and r["bitwise_equal_to_reference"] for r in done
            )
            else "**no**"
        )
        faster = (
            "n/a (no torchft completed)"
            if not verdicts
            else ("yes" if all(verdicts) else "**no**")
        )
        rows.append(
            f"| {world[1:]} | {size} | {compile_mode} | {FAULTS[kill_in]} | "
            f"{DETECTION_NAMES[detection]} | {' | '.join(cells)} | {faster} | {at_most} | "
            f"{exact} |"
        )
    return rows


GOAL_HEADER = [
    "| world | size | compile | fault | detection | reconfigure, s | torchft 0.2.0, s "
    "| torchft-nightly, s | at or below each torchft that completes | at most "
    f"{GOALS['recovery_s_at_4_ranks_1M']} s at 4 ranks, 1M | 0 lost, bitwise |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
]


def format_steady_rows(data: dict) -> List[str]:
    rows = []
    for key in sorted(data["steady"], key=order_config):
        r = data["steady"][key]
        world, size, compile_mode = key.split("-")
        if "error" in r:
            rows.append(
                f"| {world[1:]} | {size} | {compile_mode} | failed: {escape_error(r['error'])} | | | | |"
            )
            continue
        low, high = r["interval_95"]
        torchft = (
            f"{r['torchft_over_stock']:.3f}" if "torchft_over_stock" in r else "not run"
        )
        rows.append(
            f"| {world[1:]} | {size} | {compile_mode} | {r['stock_step_s'] * 1e3:.1f} | "
            f"{r['series_over_stock']:.3f} | {low:.3f} to {high:.3f} | {r['verdict']} | {torchft} |"
        )
    return rows


STEADY_HEADER = [
    "| world | size | compile | stock step, ms | series / stock | 95% interval | verdict (goal "
    f"{GOALS['steady_over_stock']}) | torchft / stock |",
    "| --- | --- | --- | --- | --- | --- | --- | --- |",
]


def format_call_rows(data: dict) -> List[str]:
    rows = []
    for key in sorted(data["call"], key=order_config):
        r = data["call"][key]
        world, size = key.split("-")
        if "error" in r:
            rows.append(
                f"| {world[1:]} | {size} | | failed: {escape_error(r['error'])} | | | |"
            )
            continue
        for mode in CALL_MODES:
            m = r[mode]
            rows.append(
                f"| {world[1:]} | {size} | {'yes' if mode == 'sync' else 'no'} | {m['call_s'] * 1e3:.2f} | "
                f"{m['rounds']} | {m['collectives_s'] * 1e3:.2f} | {m['call_over_collectives']:.2f}, "
                f"{'met' if m['met'] else 'not met'} |"
            )
    return rows


CALL_HEADER = [
    "| world | size | `sync_module_states` | call, ms | rounds | its collectives alone, ms | ratio (goal "
    f"{GOALS['call_over_collectives']}) |",
    "| --- | --- | --- | --- | --- | --- | --- |",
]


def format_instruction_rows(data: dict) -> List[str]:
    rows = []
    for key in sorted(data["instructions"], key=order_config):
        r = data["instructions"][key]
        size = key.split("-")[1]
        if "error" in r:
            rows.append(f"| {size} | failed: {escape_error(r['error'])} | | | | | |")
            continue
        check = (
            f"{r['check_s'] * 1e9:.0f}" if r.get("check_s") is not None else "no check"
        )
        rows.append(
            f"| {size} | {r['steps']} | "
            f"{', '.join(f'{n:,.0f}' for n in r['stock_per_step'])} | "
            f"{', '.join(f'{n:,.0f}' for n in r['series_per_step'])} | "
            f"{r['series_over_stock']:.5f}, {'met' if r['met'] else 'not met'} | {check} |"
        )
    return rows


INSTRUCTION_HEADER = [
    "| size | steps counted | stock, instructions a step | series, instructions a step "
    f"| series / stock (goal {GOALS['instructions_over_stock']}) | the forward pass's "
    "check, ns |",
    "| --- | --- | --- | --- | --- | --- |",
]

SECTIONS: Dict[str, tuple] = {
    "recovery": (RECOVERY_HEADER, format_recovery_rows),
    "goals": (GOAL_HEADER, format_goal_rows),
    "steady": (STEADY_HEADER, format_steady_rows),
    "call": (CALL_HEADER, format_call_rows),
    "instructions": (INSTRUCTION_HEADER, format_instruction_rows),
}


def render_markdown(data: dict) -> str:
    """Format the file's measurements as the Markdown tables of docs/benchmark.md, a table
    per section that has rows."""
    tables = []
    for header, rows_of in SECTIONS.values():
        rows_of_data: Callable[[dict], List[str]] = rows_of
        rows = rows_of_data(data)
        if rows:
            tables.append("\n".join(header + rows))
    return "\n\n".join(tables)
