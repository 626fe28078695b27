"""Read what a benchmark's training process has used: the graphs compiled, peak RSS, peak CUDA memory."""

import re

import torch
import torch._dynamo


def count_compiled_graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def read_peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        return int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1)) / 1024


def reset_peaks(device: torch.device) -> None:
    reset_peak_rss()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def read_peaks(device: torch.device) -> dict:
    """Read the peak RSS, and on CUDA the peak memory allocated, since reset_peaks()."""
    found = {"peak_rss_mb": read_peak_rss_mb()}
    if device.type == "cuda":
        found["peak_cuda_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return found
