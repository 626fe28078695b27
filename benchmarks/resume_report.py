"""Report the resume benchmark's results: its table, whether path a meets its goals, its plot.

benchmarks/resume_after_membership_change.py measures them and writes them to its JSON file;
these read that file's results as they are, older entries included.
"""

import pathlib
from typing import List

# The paths, in the order the table and the plot show them (the benchmark's --help says
# what each does).
PATHS = ("a", "a_sync", "b", "c", "d")

# What path a should achieve; see judge_goals().
GOALS = {
    "call_us": 1000.0,  # the _update_process_group call, at every size and world
    "call_growth": 1.5,  # the call at the largest size measured over the smallest, per world
    "first_step_over_steady": 1.05,  # the first step after the change, at every size and world
    "peak_rss_over_steady": 1.05,  # peak RSS during the change over the steady state's
    "peak_cuda_over_steady": 1.05,  # with --device cuda: peak CUDA memory, likewise
}


def format_table(results: List[dict]) -> str:
    """Format one line per configuration and path. Entries written before a field existed show n/a."""

    def format_cell(value, spec: str, width: int) -> str:
        return f"{value:{width}{spec}}" if value is not None else f"{'n/a':>{width}}"

    def format_ratio(value, width: int) -> str:
        # Two decimals where they matter (near 1), fewer for c's and d's hundreds and thousands.
        return format_cell(
            value, ".2f" if value is None or value < 100 else ".0f", width
        )

    cuda = any(
        "peak_cuda_mb" in p
        for r in results
        if "error" not in r
        for p in r["paths"].values()
    )
    header = (
        f"{'world':>5} {'params':>7} {'path':6} {'resume s':>9} {'x a':>7} {'ovh ms':>8} {'call us':>7} "
        f"{'1st/st':>6} {'graphs':>6} {'RSS MB':>6} {'RSS/st':>6}"
    )
    lines = [header + (f" {'CUDA MB':>7} {'CUDA/st':>7}" if cuda else "")]
    for r in results:
        if "error" in r:
            lines.append(f"{r['world']:5d} {r['size']:>7} failed: {r['error']}")
            continue
        for name in [name for name in PATHS if name in r["paths"]]:
            p = r["paths"][name]
            overhead = (
                p["overhead_s"] * 1e3 if p.get("overhead_s") is not None else None
            )
            call = f"{p['call_us']:7.0f}" if p["call_us"] is not None else f"{'':7}"
            line = (
                f"{r['world']:5d} {r['parameters'] / 1e6:6.1f}M {name:6} {p['resume_s']:9.3f} {p['over_a']:7.1f} "
                f"{format_cell(overhead, '.1f', 8)} {call} {format_ratio(p['first_step_over_steady'], 6)} "
                f"{p['graphs_compiled']:6.0f} {p['peak_rss_mb']:6.0f} {format_ratio(p.get('peak_rss_over_steady'), 6)}"
            )
            if cuda:
                line += f" {format_cell(p.get('peak_cuda_mb'), '.0f', 7)} {format_ratio(p.get('peak_cuda_over_steady'), 7)}"
            lines.append(line)
    legend = "ovh: resume less a steady step; 1st/st, RSS/st: first step, peak RSS over the steady's"
    lines.append(legend + ("; CUDA: peak memory allocated" if cuda else ""))
    return "\n".join(lines)


def judge_goals(results: List[dict]) -> List[dict]:
    """Judge whether path a meets GOALS in ``results``: one dict per goal, with ``met`` True, False, or
    None when nothing measured it (configurations that failed, or entries written before the field
    existed, are left out and counted in ``detail``). Reported, never asserted."""
    measured = sorted(
        (r for r in results if "error" not in r),
        key=lambda r: (r["world"], r["parameters"]),
    )

    def describe_config(r) -> str:
        return f"{r['world']} ranks {r['size']}"

    def judge_at_every(key: str, limit: float, text: str, unit: str, spec: str) -> dict:
        rows = [r for r in measured if r["paths"]["a"].get(key) is not None]
        skipped = len(measured) - len(rows)
        goal = {
            "goal": f"path a's {text} <= {limit:g}{unit} at every size and world",
            "limit": limit,
        }
        if not rows:
            detail = "no configuration measured it" + (
                f" ({skipped} older entries lack it)" if skipped else ""
            )
            return {**goal, "met": None, "detail": detail}
        worst = max(rows, key=lambda r: r["paths"]["a"][key])
        over = [r for r in rows if r["paths"]["a"][key] > limit]
        detail = f"max {worst['paths']['a'][key]:{spec}}{unit} at {describe_config(worst)}, of {len(rows)} configurations"
        if over:
            detail += "; over: " + ", ".join(
                f"{describe_config(r)} ({r['paths']['a'][key]:{spec}}{unit})"
                for r in over
            )
        if skipped:
            detail += f"; n/a for {skipped} older entries"
        return {**goal, "met": not over, "detail": detail}

    summary = [judge_at_every("call_us", GOALS["call_us"], "call", " us", ".0f")]
    growth_limit = GOALS["call_growth"]
    worlds = sorted({r["world"] for r in measured})
    growth = []
    for world in worlds:
        rows = [
            r
            for r in measured
            if r["world"] == world and r["paths"]["a"].get("call_us") is not None
        ]
        if len({r["size"] for r in rows}) < 2:
            continue
        small, large = rows[0], rows[-1]
        ratio = large["paths"]["a"]["call_us"] / small["paths"]["a"]["call_us"]
        growth.append(
            {
                "goal": f"{world} ranks: path a's call at the largest size <= {growth_limit:g}x the smallest's",
                "limit": growth_limit,
                "met": ratio <= growth_limit,
                "detail": f"{large['size']} {large['paths']['a']['call_us']:.0f} us / {small['size']} "
                f"{small['paths']['a']['call_us']:.0f} us = {ratio:.2f}x",
            }
        )
    if not growth:
        growth.append(
            {
                "goal": f"per world, path a's call at the largest size <= {growth_limit:g}x the smallest's",
                "limit": growth_limit,
                "met": None,
                "detail": "one size per world measured",
            }
        )
    summary += growth
    summary.append(
        judge_at_every(
            "first_step_over_steady",
            GOALS["first_step_over_steady"],
            "first step / steady step",
            "",
            ".3f",
        )
    )
    summary.append(
        judge_at_every(
            "peak_rss_over_steady",
            GOALS["peak_rss_over_steady"],
            "peak RSS / steady state's",
            "",
            ".3f",
        )
    )
    if any("peak_cuda_over_steady" in r["paths"]["a"] for r in measured):
        summary.append(
            judge_at_every(
                "peak_cuda_over_steady",
                GOALS["peak_cuda_over_steady"],
                "peak CUDA memory / steady state's",
                "",
                ".3f",
            )
        )
    return summary


def format_goals(summary: List[dict]) -> str:
    verdicts = {True: "met", False: "NOT MET", None: "n/a"}
    lines = ["goals (reported, not asserted):"]
    lines += [f"  {verdicts[g['met']]:7} {g['goal']}: {g['detail']}" for g in summary]
    return "\n".join(lines)


def plot(results: List[dict], title: str, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ratios, times) = plt.subplots(1, 2, figsize=(12, 4.5))
    for world in sorted({r["world"] for r in results}):
        rows = sorted(
            (r for r in results if r["world"] == world and "error" not in r),
            key=lambda r: r["parameters"],
        )
        params = [r["parameters"] for r in rows]
        measured = [name for name in PATHS if rows and name in rows[0]["paths"]]
        for name, marker in (("b", "o"), ("c", "s"), ("d", "^")):
            if name in measured:
                ratios.plot(
                    params,
                    [r["paths"][name]["over_a"] for r in rows],
                    marker=marker,
                    label=f"{name}/a, {world} ranks",
                )
        for name in measured:
            times.plot(
                params,
                [r["paths"][name]["resume_s"] for r in rows],
                marker="o",
                label=f"{name}, {world} ranks",
            )
    for ax, ylabel, ax_title in (
        (
            ratios,
            "time to resume / time with a",
            "How much longer than _update_process_group (a)",
        ),
        (times, "seconds", "Time to resume, to the end of the first step"),
    ):
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="parameters",
            ylabel=ylabel,
            title=ax_title,
        )
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
