"""The one timing and memory harness that every timed stage uses.

On CUDA each step is bracketed by CUDA events and read after a single
synchronize at the end, so the clock never stalls the GPU queue; on CPU, where
work is synchronous, a monotonic host clock. Memory peaks are reset when the
timed window opens.
"""

import resource
import time

import torch

MB = 1024 * 1024


class StepClock:
    """Collects per-step durations in milliseconds."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._host: list[float] = []
        self._t0 = 0.0
        self._start: torch.cuda.Event | None = None

    def start(self) -> None:
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            assert self._start is not None
            self._events.append((self._start, end))
        else:
            self._host.append((time.perf_counter() - self._t0) * 1000.0)

    def times_ms(self) -> list[float]:
        """All steps' durations; synchronizes once on CUDA."""
        if not self.cuda:
            return list(self._host)
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in self._events]


def reset_peaks(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def current_mb(device: torch.device) -> float:
    """Memory held now: CUDA tensors on a GPU, the process's resident set on CPU."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / MB
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / MB


def peaks(device: torch.device) -> dict[str, float | None]:
    """Peak memory since the last reset; on CPU only the process's lifetime peak RSS exists."""
    if device.type == "cuda":
        return {
            "peak_mem_allocated_mb": torch.cuda.max_memory_allocated(device) / MB,
            "peak_mem_reserved_mb": torch.cuda.max_memory_reserved(device) / MB,
            "peak_rss_mb": None,
        }
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"peak_mem_allocated_mb": None, "peak_mem_reserved_mb": None, "peak_rss_mb": rss_kb / 1024}
