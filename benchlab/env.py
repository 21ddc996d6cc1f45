"""The environment a number was measured in, and where it came from.

`environment()` holds only what changes the timings (hardware, driver,
library versions, thread count): the `env` stage writes it, and the timing
stages depend on that file, so DVC reuses a timing only on the same machine
and software. `provenance()` adds what identifies one run (commit, date).
"""

import os
import platform
import subprocess
from datetime import datetime, timezone

import torch


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None


def environment() -> dict:
    """Hardware and software that a timing depends on; stable across runs on one machine."""
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
        "cuda": torch.version.cuda,
        "gpu": None, "gpu_count": 0, "gpu_capability": None, "driver": None, "cudnn": None,
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpu_count"] = torch.cuda.device_count()
        env["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        env["cudnn"] = torch.backends.cudnn.version()
        driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        env["driver"] = driver.splitlines()[0] if driver else None
    return env


def provenance() -> dict:
    """The commit and time of a run; changes every run, so never a DVC dependency.

    BENCHLAB_GIT_COMMIT, when set, names the source commit of a run made in a
    scratch copy (scripts/gpu_matrix.sh sets it), whose own HEAD means nothing.
    """
    return {
        "provenance.git_commit": os.environ.get("BENCHLAB_GIT_COMMIT") or _run(["git", "rev-parse", "HEAD"]),
        "provenance.date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
