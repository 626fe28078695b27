"""The plot of the results file, recovery_after_lost_rank.png."""

import itertools
import pathlib
import statistics

from benchmarks.recovery import results
from benchmarks.recovery.cells import CALL_MODES, find_detection, GOALS, PATHS
from benchmarks.recovery.report import order_config


def plot(data: dict, path: pathlib.Path) -> None:
    """Plot four panels: the two recovery times of each path per configuration and fault
    (the median of the runs, the range as an error bar), the steady step over stock DDP's
    with its 95% interval, and the call over its collectives alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ((kill, new), (steady, call)) = plt.subplots(2, 2, figsize=(16, 9))
    # A configuration and its fault: the key of a cell without its detection and path. Each
    # path's bar is of its detection by default: torchft's lighthouse, heartbeats for a
    # hang, else the local agent.
    configs = sorted(
        {
            key.rsplit("-", 2)[0]
            for key in data["cells"]
            if results.select_current_runs(data, key)
        },
        key=order_config,
    )
    width = 0.8 / len(PATHS)
    for ax, field, title in (
        (kill, "kill_to_survivors_step_s", "Kill to the survivors' next step"),
        (new, "new_process_to_first_step_s", "New process to its first step"),
    ):
        labeled = set()
        for (x, config), (i, recovery_path) in itertools.product(
            enumerate(configs), enumerate(PATHS)
        ):
            detection = find_detection(
                recovery_path, config.rsplit("-", 1)[1], "local_agent"
            )
            runs = results.select_current_runs(
                data, f"{config}-{detection}-{recovery_path}"
            )
            if not runs:
                continue
            position = x + (i - (len(PATHS) - 1) / 2) * width
            values = [r[field] for r in runs if "error" not in r]
            if not values:
                ax.text(
                    position,
                    0.02,
                    f"{recovery_path}: failed",
                    rotation=90,
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    color=f"C{i}",
                    transform=ax.get_xaxis_transform(),
                )
                continue
            median = statistics.median(values)
            ax.bar(
                position,
                median,
                width,
                yerr=[[median - min(values)], [max(values) - median]],
                capsize=2,
                color=f"C{i}",
                label=None if recovery_path in labeled else recovery_path,
            )
            labeled.add(recovery_path)
        ax.set_xticks(range(len(configs)), configs, rotation=30, ha="right", fontsize=7)
        ax.set(ylabel="seconds", yscale="log", title=title)
    steady_keys = sorted(data["steady"], key=order_config)
    for x, key in enumerate(steady_keys):
        r = data["steady"][key]
        if "error" in r:
            continue
        low, high = r["interval_95"]
        mean = r["series_over_stock"]
        steady.errorbar(
            x,
            mean,
            yerr=[[mean - low], [high - mean]] if low is not None else None,
            fmt="o",
            color="C0",
            capsize=3,
            label="series / stock" if x == 0 else None,
        )
        if "torchft_over_stock" in r:
            steady.plot(
                x,
                r["torchft_over_stock"],
                "s",
                color="C2",
                label="torchft / stock" if x == 0 else None,
            )
    steady.axhline(
        GOALS["steady_over_stock"],
        color="k",
        linestyle="--",
        linewidth=0.8,
        label="goal",
    )
    steady.axhline(1.0, color="k", linewidth=0.5)
    steady.set_xticks(
        range(len(steady_keys)), steady_keys, rotation=30, ha="right", fontsize=7
    )
    steady.set(
        ylabel="step time / stock DDP's", title="Steady step, with the 95% interval"
    )
    call_keys = sorted(data["call"], key=order_config)
    for i, mode in enumerate(CALL_MODES):
        points = [
            (x, data["call"][key][mode]["call_over_collectives"])
            for x, key in enumerate(call_keys)
            if "error" not in data["call"][key]
        ]
        call.plot(
            [x for x, _ in points],
            [y for _, y in points],
            "o",
            color=f"C{i}",
            label=f"sync_module_states={mode == 'sync'}",
        )
    call.axhline(
        GOALS["call_over_collectives"],
        color="k",
        linestyle="--",
        linewidth=0.8,
        label="goal",
    )
    call.set_xticks(range(len(call_keys)), call_keys, fontsize=7)
    call.set(
        ylabel="call / its collectives alone", title="The _update_process_group call"
    )
    for ax in (kill, new, steady, call):
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    machine = data["machine"]
    fig.suptitle(
        f"Recovery after a lost rank: torch {machine['torch']}, torchft {machine['torchft']}, "
        f"Gloo, {machine['cpus']} CPUs",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
