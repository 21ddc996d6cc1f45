"""The one timing and memory harness that every timed stage uses.

On CUDA each step is bracketed by CUDA events and read after a single
synchronize at the end, so the clock never stalls the GPU queue; on CPU, where
work is synchronous, a monotonic host clock. Memory peaks are reset when the
timed window opens.
"""

import os
import resource
import subprocess
import time
from typing import Any

import torch

from benchlab.core.errors import LabError
from benchlab.core.record import ALLOCATED, RESERVED, RSS

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


def cap_memory(device: torch.device, cap_gib: float) -> None:
    """Let torch's allocator on this GPU hold at most `cap_gib` GiB (0: no cap, the whole card).

    torch.cuda.set_per_process_memory_fraction makes an allocation past the cap raise the same OOM that a
    card of that size would. The CUDA context and library workspaces sit outside the allocator, so a real card
    of that size has a few hundred MiB less to give.
    """
    if cap_gib <= 0:
        if device.type == "cuda":  # the whole card: an earlier capped run in this process must not cap this one
            torch.cuda.set_per_process_memory_fraction(1.0, _index(device))
        return
    if device.type != "cuda":
        raise LabError(f"harness.memory_cap_gib={cap_gib:g} caps a GPU's memory, but this run is on the "
                       f"{device.type}; set harness.memory_cap_gib=0")
    total = torch.cuda.get_device_properties(device).total_memory
    if cap_gib * 2**30 > total:
        raise LabError(f"harness.memory_cap_gib={cap_gib:g} is more than {torch.cuda.get_device_name(device)}'s "
                       f"{total / 2**30:.1f} GiB; set at most {total / 2**30:.1f}, or 0 for no cap")
    torch.cuda.set_per_process_memory_fraction(cap_gib * 2**30 / total, _index(device))


def _index(device: torch.device) -> int:
    """The card a device means: `cuda` alone names the current one."""
    return device.index if device.index is not None else torch.cuda.current_device()


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
            ALLOCATED: torch.cuda.max_memory_allocated(device) / MB,
            RESERVED: torch.cuda.max_memory_reserved(device) / MB,
            RSS: None,
        }
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {ALLOCATED: None, RESERVED: None, RSS: rss_kb / 1024}


def process_age_s() -> float | None:
    """Seconds since this process started (Linux /proc), or None where that cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, after the command name
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values) - idle, sum(values)


def gpu_processes(uuid: str | None = None) -> list[int] | None:
    """PIDs nvidia-smi sees computing on the GPU of this UUID (any GPU when None), or None where it cannot tell.

    Processes on the machine's other GPUs do not share this one's SMs or memory, so a job on GPU 1 does not
    flag a timing on GPU 0; what they share (the host's cores) is watched by the CPU counters.
    """
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [int(pid) for pid, gpu in _apps(out) if uuid is None or _same_gpu(gpu, uuid)]


def _apps(csv: str) -> list[tuple[str, str]]:
    """(pid, gpu uuid) pairs of nvidia-smi's compute-apps lines."""
    pairs = [tuple(part.strip() for part in line.split(",")) for line in csv.splitlines() if line.strip()]
    return [(pair[0], pair[1]) for pair in pairs if len(pair) == 2 and pair[0].isdigit()]


def _same_gpu(a: str, b: str) -> bool:
    """nvidia-smi writes GPU-<uuid>; torch may leave the prefix off."""
    norm = [u.strip().lower().removeprefix("gpu-") for u in (a, b)]
    return norm[0] == norm[1]


def device_uuid(device: torch.device) -> str | None:
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return str(torch.cuda.get_device_properties(index).uuid)


class Neighbours:
    """What else used the machine during a timed window: other GPU processes, and CPU time not ours."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.uuid = device_uuid(device)
        self.ours = {os.getpid(), os.getppid()}
        self.seen: set[int] = set()
        self.known = True

    def start(self) -> None:
        self._look()
        self._t0, self._jiffies0 = time.perf_counter(), _cpu_jiffies()
        self._self0 = time.process_time()

    def _look(self) -> None:
        if not self.cuda:
            return
        pids = gpu_processes(self.uuid)
        if pids is None:
            self.known = False
        else:
            self.seen.update(set(pids) - self.ours)

    def finish(self) -> dict[str, Any]:
        """Flat facts for the result record; busy shares are of all cores, in percent."""
        self._look()
        busy, total = (b - a for a, b in zip(self._jiffies0, _cpu_jiffies()))
        cores = os.cpu_count() or 1
        wall = time.perf_counter() - self._t0
        ours = 100.0 * (time.process_time() - self._self0) / (wall * cores) if wall > 0 else 0.0
        machine = 100.0 * busy / total if total else 0.0
        return {
            "pid": os.getpid(),  # so that a multi-rank run can tell its own ranks from neighbours
            "other_gpu_processes": sorted(self.seen) if self.cuda and self.known else None,
            "cpu_busy_pct": machine,
            "cpu_busy_ours_pct": ours,
            "cpu_busy_others_pct": max(0.0, machine - ours),
        }
