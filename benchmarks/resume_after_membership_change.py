"""Time to resume training after a membership change: _update_process_group against what users do today.

For each world size and model size, a launcher starts one process per rank (Gloo on CPU, a
TCPStore it hosts). Each rank builds a transformer, wraps it in DistributedDataParallel,
compiles it, trains a few steps, and measures the steady-state step. Then, in the same
processes, it goes through a membership change again and again, each path in turn:

  a       destroy and init the default group; ddp._update_process_group(WORLD); first step
  a_sync  the same with sync_module_states=True, as a rank that joins needs
  b       destroy and init the group; wrap the same module in a new DDP, torch.compile it
          again; first step (what users of torch 2.1 do today)
  d       like b, but with the module rebuilt from its state dict: new module objects, and a
          new optimizer loaded from the old one's state

and afterwards, in new processes:

  c       what TorchElastic does: restart the workers. From the moment the launcher starts
          them: import torch, build the model, load the checkpoint (model and optimizer),
          init the group, wrap, compile, first step.

The change keeps the same ranks (a new group of the same members, as after a lost rank was
replaced), so that every path does the same collective work. Times are wall clock, the slowest
rank's; the ratios b/a, c/a and d/a compare paths measured in one run on one machine.
Reported per path: time to resume, its overhead (the time to resume less one steady-state
step), the latency of the _update_process_group call itself, the first step after the change
against the steady-state step, graphs compiled (torch._dynamo's unique_graphs), and peak RSS
(VmHWM, reset before each path with /proc/self/clear_refs), also against the steady state's
(reset before the steady-state steps).

With --device cuda, each rank trains on a GPU: its own, over NCCL, where there are enough GPUs,
else sharing them, over Gloo (--group-backend chooses). Steps are then timed to the end of their
GPU work, and the peak CUDA memory allocated during a change is reported against the steady
state's. --paths measures some of the paths only, for example path a alone on a GPU machine.

Writes a table and whether path a meets its goals (GOALS in benchmarks/resume_report.py;
reported, never asserted: the exit status does not depend on them) to stdout, and
resume_after_membership_change.json (the goals too) and .png to --out. The model it trains is
benchmarks/model.py's, which the recovery benchmark trains too.
Needs torch with the series (the overlay venv: scripts/benchmark runs it there).
"""

import argparse
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

import torch
import torch.distributed as dist
import torch.nn as nn

from benchmarks.model import LanguageModel, SEQUENCE, SIZES, VOCAB
from benchmarks.process_stats import count_compiled_graphs, read_peaks, reset_peaks
from benchmarks.resume_report import (
    format_goals,
    format_table,
    judge_goals,
    PATHS,
    plot,
)
from torch.nn.parallel import DistributedDataParallel

IN_PROCESS_PATHS = ("a", "a_sync", "b", "d")


# The ranks


def find_group_backend(args) -> str:
    if args.group_backend:
        return args.group_backend
    if args.device == "cuda" and args.world <= torch.cuda.device_count():
        return "nccl"
    return "gloo"


class Rank:
    """One rank's model, DDP module, compiled module and optimizer, and how to train a step."""

    def __init__(self, args, store):
        self.args, self.store = args, store
        self.generation = 0
        self.device = torch.device("cpu")
        if args.device == "cuda":
            self.device = torch.device("cuda", args.rank % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
        torch.manual_seed(0)
        self.module = LanguageModel(SIZES[args.size]).to(self.device)
        self.loss_fn = nn.CrossEntropyLoss()
        self.step_index = 0

    def init_group(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        self.generation += 1
        dist.init_process_group(
            find_group_backend(self.args),
            store=dist.PrefixStore(
                f"{self.args.session}/{self.args.role}/{self.generation}", self.store
            ),
            rank=self.args.rank,
            world_size=self.args.world,
        )

    def wrap(self) -> None:
        device_ids = [self.device] if self.device.type == "cuda" else None
        self.ddp = DistributedDataParallel(self.module, device_ids=device_ids)
        self.compiled = torch.compile(self.ddp, backend=self.args.backend)

    def make_optimizer(self, state=None) -> None:
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=1e-4)
        if state is not None:
            self.optimizer.load_state_dict(state)

    def step(self) -> float:
        """Run one training step; return its wall time in seconds."""
        gen = torch.Generator().manual_seed(1000 * self.step_index + self.args.rank)
        tokens = torch.randint(0, VOCAB, (2, SEQUENCE + 1), generator=gen).to(
            self.device
        )
        start = time.perf_counter()
        logits = self.compiled(tokens[:, :-1])
        self.loss_fn(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.step_index += 1
        return time.perf_counter() - start

    def change(self, path: str) -> dict:
        """Go through a membership change by ``path``, up to the end of the first step."""
        dist.barrier()
        reset_peaks(self.device)
        graphs = count_compiled_graphs()
        # DDP holds the last reference to the group that init_group() destroys, so the call
        # would free it: ProcessGroupGloo's destructor joins its threads. Held here, that is
        # timed apart from the call, and still counts in resume_s.
        old_group = self.ddp.process_group
        start = time.perf_counter()
        self.init_group()
        call_s = old_group_free_s = None
        if path in ("a", "a_sync"):
            # The call is a collective on the new group: time it once every rank has arrived,
            # so that it measures the call, not how late the last rank came.
            dist.barrier()
            call_start = time.perf_counter()
            self.ddp._update_process_group(
                dist.group.WORLD, sync_module_states=path == "a_sync"
            )
            call_s = time.perf_counter() - call_start
            free_start = time.perf_counter()
            del old_group
            old_group_free_s = time.perf_counter() - free_start
        else:
            del old_group
        if path == "b":
            self.wrap()
        elif path == "d":
            state, optimizer_state = (
                self.module.state_dict(),
                self.optimizer.state_dict(),
            )
            self.module = LanguageModel(SIZES[self.args.size]).to(self.device)
            self.module.load_state_dict(state)
            self.wrap()
            self.make_optimizer(optimizer_state)
        first_step_s = self.step()
        resume_s = time.perf_counter() - start
        return {
            "resume_s": resume_s,
            "call_s": call_s,
            "old_group_free_s": old_group_free_s,
            "first_step_s": first_step_s,
            "graphs_compiled": count_compiled_graphs() - graphs,
            **read_peaks(self.device),
        }


def run_rank(args) -> dict:
    """Run the in-process paths: warm up, measure the steady state, then change again and again."""
    store = dist.TCPStore(
        args.host, args.port, is_master=False, timeout=datetime.timedelta(seconds=600)
    )
    rank = Rank(args, store)
    rank.init_group()
    rank.wrap()
    rank.make_optimizer()
    for _ in range(args.warmup):
        rank.step()
    reset_peaks(rank.device)
    steady = statistics.median([rank.step() for _ in range(args.steady_steps)])
    steady_peaks = {
        f"steady_{key}": value for key, value in read_peaks(rank.device).items()
    }
    paths = [path for path in IN_PROCESS_PATHS if path in args.paths]
    changes: Dict[str, List[dict]] = {path: [] for path in paths}
    # One path's changes after the other's, in IN_PROCESS_PATHS order: d leaves its old
    # modules alive (see README), which would add to the peak RSS of a path measured after it.
    for path in paths:
        for repeat in range(args.repeats):
            changes[path].append(rank.change(path))
            if args.rank == 0:
                print(
                    f"    repeat {repeat + 1}/{args.repeats}: {path:6s} {changes[path][-1]['resume_s']:8.3f} s",
                    flush=True,
                )
            # Back to the steady state before the next change.
            for _ in range(2):
                rank.step()
    if args.rank == 0:
        torch.save(
            {
                "model": rank.module.state_dict(),
                "optimizer": rank.optimizer.state_dict(),
            },
            args.checkpoint,
        )
    dist.barrier()
    dist.destroy_process_group()
    return {"steady_step_s": steady, **steady_peaks, "changes": changes}


def run_restarted_rank(args) -> dict:
    """Run path c, in a process the launcher started at args.started (time.time())."""
    store = dist.TCPStore(
        args.host, args.port, is_master=False, timeout=datetime.timedelta(seconds=600)
    )
    rank = Rank(args, store)
    checkpoint = torch.load(args.checkpoint)
    rank.module.load_state_dict(checkpoint["model"])
    rank.init_group()
    rank.wrap()
    rank.make_optimizer(checkpoint["optimizer"])
    first_step_s = rank.step()
    resume_s = time.time() - args.started
    result = {
        "resume_s": resume_s,
        "call_s": None,
        "first_step_s": first_step_s,
        "graphs_compiled": count_compiled_graphs(),
        **read_peaks(rank.device),
    }
    dist.destroy_process_group()
    return result


# The launcher


class ConfigurationFailed(Exception):
    pass


def launch(args, role: str, session: str, store, checkpoint: str) -> List[dict]:
    """Start args.world ranks in ``role``, wait for them, and return their results by rank."""
    started = time.time()
    procs = []
    for rank in range(args.world):
        cmd = [
            sys.executable,
            __file__,
            "--role",
            role,
            "--rank",
            str(rank),
            "--world",
            str(args.world),
        ]
        cmd += [
            "--size",
            args.size,
            "--backend",
            args.backend,
            "--port",
            str(store.port),
        ]
        cmd += ["--device", args.device, "--paths", *args.paths]
        if args.group_backend:
            cmd += ["--group-backend", args.group_backend]
        cmd += [
            "--session",
            session,
            "--checkpoint",
            checkpoint,
            "--started",
            repr(started),
        ]
        cmd += [
            "--repeats",
            str(args.repeats),
            "--warmup",
            str(args.warmup),
            "--steady-steps",
            str(args.steady_steps),
        ]
        procs.append(subprocess.Popen(cmd))
    try:
        # The others would wait in a collective for a rank that failed (out of memory, say).
        while any(p.poll() is None for p in procs) and not any(p.poll() for p in procs):
            time.sleep(0.5)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    codes = [p.wait() for p in procs]
    if any(codes):
        raise ConfigurationFailed(
            f"the {role} processes exited with {codes}; -9 is a kill, as for lack of memory"
        )
    return [
        json.loads(store.get(f"{session}/{role}/result/{rank}"))
        for rank in range(args.world)
    ]


def summarize(per_rank: List[List[dict]]) -> dict:
    """Summarize one path's repeats on every rank: the slowest rank of each repeat, then the median repeat."""

    def take_median(key, pick=max):
        values = [pick(r[i][key] for r in per_rank) for i in range(len(per_rank[0]))]
        return statistics.median(values)

    calls = [c["call_s"] for r in per_rank for c in r if c["call_s"] is not None]
    frees = [
        c["old_group_free_s"]
        for r in per_rank
        for c in r
        if c.get("old_group_free_s") is not None
    ]
    summary = {
        "resume_s": take_median("resume_s"),
        "call_us": statistics.median(calls) * 1e6 if calls else None,
        "old_group_free_us": statistics.median(frees) * 1e6 if frees else None,
        "first_step_s": take_median("first_step_s"),
        "graphs_compiled": take_median("graphs_compiled"),
        "peak_rss_mb": take_median("peak_rss_mb"),
        "repeats": len(per_rank[0]),
    }
    if "peak_cuda_mb" in per_rank[0][0]:
        summary["peak_cuda_mb"] = take_median("peak_cuda_mb")
    return summary


def measure(args, store) -> dict:
    """Measure every path for args.world and args.size."""
    session = f"w{args.world}-{args.size}"
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = os.path.join(tmp, "checkpoint.pt")
        ranks = launch(args, "rank", session, store, checkpoint)
        paths = {
            p: summarize([r["changes"][p] for r in ranks]) for p in ranks[0]["changes"]
        }
        if "c" in args.paths:
            restarts = []
            for restart in range(args.restarts):
                restarts.append(
                    launch(args, "restarted", f"{session}-{restart}", store, checkpoint)
                )
                slowest = max(r["resume_s"] for r in restarts[-1])
                print(
                    f"    restart {restart + 1}/{args.restarts}: c      {slowest:8.3f} s",
                    flush=True,
                )
            paths["c"] = summarize(
                [
                    [restarts[i][rank] for i in range(len(restarts))]
                    for rank in range(args.world)
                ]
            )
    steady = max(r["steady_step_s"] for r in ranks)
    steady_peaks = {
        key: max(r[key] for r in ranks)
        for key in ranks[0]
        if key.startswith("steady_peak_")
    }
    for path in paths.values():
        path["first_step_over_steady"] = path["first_step_s"] / steady
        path["over_a"] = path["resume_s"] / paths["a"]["resume_s"]
        path["overhead_s"] = path["resume_s"] - steady
        path["peak_rss_over_steady"] = (
            path["peak_rss_mb"] / steady_peaks["steady_peak_rss_mb"]
        )
        if "peak_cuda_mb" in path:
            path["peak_cuda_over_steady"] = (
                path["peak_cuda_mb"] / steady_peaks["steady_peak_cuda_mb"]
            )
    params = sum(p.numel() for p in LanguageModel(SIZES[args.size]).parameters())
    return {
        "world": args.world,
        "size": args.size,
        "parameters": params,
        "group_backend": find_group_backend(args),
        "repeats": args.repeats,
        "restarts": args.restarts if "c" in args.paths else 0,
        "steady_step_s": steady,
        **steady_peaks,
        "paths": paths,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--worlds",
        type=int,
        nargs="+",
        default=[2, 4],
        help="world sizes (default: 2 4)",
    )
    parser.add_argument(
        "--sizes",
        nargs="+",
        choices=list(SIZES),
        default=["1M", "10M", "100M"],
        help="model sizes (default: 1M 10M 100M)",
    )
    parser.add_argument(
        "--backend",
        default="inductor",
        help="torch.compile backend (default: inductor)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the ranks train (default: cpu)",
    )
    parser.add_argument(
        "--group-backend",
        choices=("gloo", "nccl"),
        help="the process group's backend (default: gloo on CPU; on CUDA, nccl where each rank "
        "has a GPU of its own, else gloo)",
    )
    parser.add_argument(
        "--paths",
        nargs="+",
        choices=PATHS,
        default=list(PATHS),
        help="the paths to measure; a always (default: all)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="changes by each in-process path (default: 3)",
    )
    parser.add_argument(
        "--restarts", type=int, default=2, help="restarts for path c (default: 2)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=3,
        help="steps before the steady state is measured",
    )
    parser.add_argument(
        "--steady-steps",
        type=int,
        default=5,
        help="steps whose median is the steady state",
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="add to the JSON file in --out, replacing the configurations measured again, "
        "and plot them all (for a long run in parts)",
    )
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=pathlib.Path(__file__).parent / "results",
        help="where the JSON file and the plot go (default: benchmarks/results)",
    )
    parser.add_argument("--host", default="127.0.0.1", help=argparse.SUPPRESS)
    parser.add_argument(
        "--role",
        choices=("launcher", "rank", "restarted"),
        default="launcher",
        help=argparse.SUPPRESS,
    )
    for name in ("--rank", "--world", "--port"):
        parser.add_argument(name, type=int, help=argparse.SUPPRESS)
    for name in ("--size", "--session", "--checkpoint"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    parser.add_argument("--started", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.role != "launcher":
        # The ranks share the machine's cores.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.world))
        result = run_rank(args) if args.role == "rank" else run_restarted_rank(args)
        store = dist.TCPStore(args.host, args.port, is_master=False)
        store.set(f"{args.session}/{args.role}/result/{args.rank}", json.dumps(result))
        return 0

    if not hasattr(DistributedDataParallel, "_update_process_group"):
        parser.error(
            f"torch {torch.__version__} has no DistributedDataParallel._update_process_group"
        )
    if args.repeats < 1 or args.restarts < 1:
        parser.error("--repeats and --restarts must be at least 1")
    if "a" not in args.paths:
        parser.error("--paths must include a: the other paths are measured against it")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    if args.group_backend == "nccl" and args.device != "cuda":
        parser.error("--group-backend nccl needs --device cuda")
    store = dist.TCPStore(args.host, 0, is_master=True, wait_for_workers=False)
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / "resume_after_membership_change.json"
    report = {
        "torch": torch.__version__,
        "backend": args.backend,
        "cpus": os.cpu_count(),
        "memory_gib": round(
            os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1
        ),
        "device": args.device,
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
        "results": [],
    }
    configs = [(w, s) for w in args.worlds for s in args.sizes]
    if args.update and json_path.exists():
        earlier = json.loads(json_path.read_text())
        machine = ("torch", "backend", "cpus", "memory_gib", "device", "gpu")
        # Results written before --device were measured on CPU.
        earlier = {"device": "cpu", "gpu": None, **earlier}
        if {k: earlier.get(k) for k in machine} != {k: report[k] for k in machine}:
            parser.error(
                f"{json_path} was measured with another torch, backend or machine; --update cannot add to it"
            )
        report["results"] = [
            r for r in earlier["results"] if (r["world"], r["size"]) not in configs
        ]
    for i, (world, size) in enumerate(configs, 1):
        args.world, args.size = world, size
        print(
            f"[benchmark] {i}/{len(configs)}: {world} ranks, {size} parameters, backend {args.backend}, "
            f"{find_group_backend(args)} on {args.device}",
            flush=True,
        )
        try:
            report["results"].append(measure(args, store))
        except ConfigurationFailed as e:
            print(
                f"[benchmark] {world} ranks, {size} parameters: failed: {e}", flush=True
            )
            report["results"].append({"world": world, "size": size, "error": str(e)})
        # Written after every configuration, so that a long run keeps what it measured.
        report["results"].sort(key=lambda r: (r["world"], list(SIZES).index(r["size"])))
        report["goals"] = judge_goals(report["results"])
        json_path.write_text(json.dumps(report, indent=1) + "\n")
    print(format_table(report["results"]))
    print(format_goals(report["goals"]))
    where = f"{report['gpu']}, CUDA" if args.device == "cuda" else "CPU"
    title = f"torch {torch.__version__} on {where}, compiled with {args.backend}"
    plot(report["results"], title, args.out / "resume_after_membership_change.png")
    print(f"[benchmark] wrote {json_path} and {json_path.with_suffix('.png')}")
    failed = [r for r in report["results"] if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
