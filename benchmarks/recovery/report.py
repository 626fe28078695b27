"""The results file as text: the table printed after a run, the Markdown of docs/benchmark.md,
and the plot."""

import itertools
import pathlib

from benchmarks.recovery.cells import CALL_MODES, GOALS, PATHS
from benchmarks.resume_after_membership_change import SIZES


def short_steps(cell: dict) -> str:
    """Formats a cell's steps short of a member; measurements from before the count have none."""
    return str(cell["short_steps"]) if "short_steps" in cell else "n/c"


def table(data: dict) -> str:
    """Formats the file's measurements as the table printed after a run."""
    lines = [
        f"{'world':>5} {'size':>5} {'compile':8} {'killed in':13} {'path':14} {'kill->step s':>12} "
        f"{'new->step s':>11} {'discarded':>9} {'lost':>4} {'short':>5} {'exact':>5} {'max diff':>9} {'graphs':>6} "
        f"{'RSS/st':>6} {'step ms':>7}"
    ]
    for key, r in data["cells"].items():
        world, size, compile_mode, kill_in, path = key.split("-", 4)
        row = f"{world[1:]:>5} {size:>5} {compile_mode:8} {kill_in:13} {path:14}"
        if "error" in r:
            lines.append(f"{row} failed: {r['error']}")
            continue
        lines.append(
            f"{row} {r['kill_to_survivors_step_s']:12.2f} "
            f"{r['new_process_to_first_step_s']:11.2f} {r['discarded_attempts']:9d} {r['lost_updates']:4d} "
            f"{short_steps(r):>5} {'yes' if r['bitwise_equal_to_reference'] else 'no':>5} {r['max_abs_diff']:9.2e} "
            f"{r['graphs_after_warmup']:6d} {r['recovery_rss_over_steady']:6.2f} "
            f"{(r['steady_step_s'] or 0) * 1e3:7.1f}"
        )
    for key, r in data["steady"].items():
        if "error" in r:
            lines.append(f"steady {key}: failed: {r['error']}")
            continue
        low, high = r["interval_95"]
        text = (
            f"steady {key}: series/stock {r['series_over_stock']:.4f} "
            f"(95% {low if low is None else round(low, 4)}..{high if high is None else round(high, 4)}, "
            f"{r['repeats']} repeats): {r['verdict']} (goal {GOALS['steady_over_stock']})"
        )
        if "torchft_over_stock" in r:
            text += f"; torchft/stock {r['torchft_over_stock']:.3f}"
        lines.append(text)
    for key, r in data["call"].items():
        if "error" in r:
            lines.append(f"call {key}: failed: {r['error']}")
            continue
        for mode in CALL_MODES:
            m = r[mode]
            lines.append(
                f"call {key} {mode:7}: {m['call_s'] * 1e3:8.2f} ms, its {m['rounds']} collectives alone "
                f"{m['collectives_s'] * 1e3:8.2f} ms: x{m['call_over_collectives']:.2f} "
                f"({'met' if m['met'] else 'not met'}, goal {GOALS['call_over_collectives']})"
            )
    return "\n".join(lines)


def escaped(error: str) -> str:
    """Returns an error's first 160 characters, for a cell of a Markdown table."""
    return error[:160].replace("|", "\\|")


def markdown(data: dict) -> str:
    """Formats the file's measurements as the Markdown tables of docs/benchmark.md."""
    lines = [
        "| world | size | compile | killed in | path | kill → survivors' next step, s | new process → its first "
        "step, s | discarded | lost | short of a member | equal to the reference | RSS in recovery / steady | "
        "graphs after warm-up |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def cell_order(key: str) -> tuple:
        config, path = key.rsplit("-", 1)
        return config_order(config), PATHS.index(path)

    for key in sorted(data["cells"], key=cell_order):
        r = data["cells"][key]
        world, size, compile_mode, kill_in, path = key.split("-", 4)
        row = f"| {world[1:]} | {size} | {compile_mode} | {kill_in.replace('_', ' ')} | {path} |"
        if "error" in r:
            lines.append(f"{row} failed: {escaped(r['error'])} | | | | | | | |")
            continue
        exact = (
            "bitwise"
            if r["bitwise_equal_to_reference"]
            else f"no: at most {r['max_abs_diff']:.1e}"
            + (
                f", relative L2 {r['relative_l2_diff']:.1e}"
                if "relative_l2_diff" in r
                else ""
            )
        )
        lines.append(
            f"{row} {r['kill_to_survivors_step_s']:.2f} | {r['new_process_to_first_step_s']:.2f} | "
            f"{r['discarded_attempts']} | {r['lost_updates']} | {short_steps(r)} | {exact} | "
            f"{r['recovery_rss_over_steady']:.2f} | "
            f"{r['graphs_after_warmup']} |"
        )
    lines += [
        "",
        "| world | size | compile | stock step, ms | series / stock | 95% interval | verdict (goal "
        f"{GOALS['steady_over_stock']}) | torchft / stock |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key in sorted(data["steady"], key=config_order):
        r = data["steady"][key]
        world, size, compile_mode = key.split("-")
        if "error" in r:
            lines.append(
                f"| {world[1:]} | {size} | {compile_mode} | failed: {escaped(r['error'])} | | | | |"
            )
            continue
        low, high = r["interval_95"]
        torchft = (
            f"{r['torchft_over_stock']:.3f}" if "torchft_over_stock" in r else "not run"
        )
        lines.append(
            f"| {world[1:]} | {size} | {compile_mode} | {r['stock_step_s'] * 1e3:.1f} | "
            f"{r['series_over_stock']:.3f} | {low:.3f} to {high:.3f} | {r['verdict']} | {torchft} |"
        )
    lines += [
        "",
        "| world | size | `sync_module_states` | call, ms | rounds | its collectives alone, ms | ratio (goal "
        f"{GOALS['call_over_collectives']}) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key in sorted(data["call"], key=config_order):
        r = data["call"][key]
        world, size = key.split("-")
        if "error" in r:
            lines.append(
                f"| {world[1:]} | {size} | | failed: {escaped(r['error'])} | | | |"
            )
            continue
        for mode in CALL_MODES:
            m = r[mode]
            lines.append(
                f"| {world[1:]} | {size} | {'yes' if mode == 'sync' else 'no'} | {m['call_s'] * 1e3:.2f} | "
                f"{m['rounds']} | {m['collectives_s'] * 1e3:.2f} | {m['call_over_collectives']:.2f}, "
                f"{'met' if m['met'] else 'not met'} |"
            )
    return "\n".join(lines)


def plot(data: dict, path: pathlib.Path) -> None:
    """Plots four panels: the two recovery times of each path per configuration, the steady step
    over stock DDP's with its 95% interval, and the call over its collectives alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ((kill, new), (steady, call)) = plt.subplots(2, 2, figsize=(16, 9))
    # A configuration and where the kill came: the key of a cell without its path.
    configs = sorted({key.rsplit("-", 1)[0] for key in data["cells"]}, key=config_order)
    width = 0.8 / len(PATHS)
    for ax, field, title in (
        (kill, "kill_to_survivors_step_s", "Kill to the survivors' next step"),
        (new, "new_process_to_first_step_s", "New process to its first step"),
    ):
        labeled = set()
        for (x, config), (i, recovery_path) in itertools.product(
            enumerate(configs), enumerate(PATHS)
        ):
            r = data["cells"].get(f"{config}-{recovery_path}")
            if r is None:
                continue
            position = x + (i - (len(PATHS) - 1) / 2) * width
            if "error" in r:
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
            ax.bar(
                position,
                r[field],
                width,
                color=f"C{i}",
                label=None if recovery_path in labeled else recovery_path,
            )
            labeled.add(recovery_path)
        ax.set_xticks(range(len(configs)), configs, rotation=30, ha="right", fontsize=7)
        ax.set(ylabel="seconds", yscale="log", title=title)
    steady_keys = sorted(data["steady"], key=config_order)
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
    call_keys = sorted(data["call"], key=config_order)
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


def config_order(key: str) -> tuple:
    """Returns the sort key of a configuration: by world, then model size, then the rest
    (compile mode, where the kill came), so that w2-10M-none sorts after w2-1M-inductor.
    """
    world, size, *rest = key.split("-")
    return int(world[1:]), list(SIZES).index(size), rest
