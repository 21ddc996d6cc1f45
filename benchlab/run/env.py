"""The environment a number was measured in, and where it came from.

`environment()` holds the hardware and software a number was measured with;
every result record carries all of it. `timing_environment()` is the part that
decides a timing (hardware, driver, library versions, thread count): the `env`
stage writes it, and the timing stages depend on that file, so DVC reuses a
timing on any machine of the same kind with the same software. `provenance()`
adds what identifies one run (commit, date).
"""

import hashlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]  # benchlab/run/env.py -> the project root
# The code a result depends on: everything a stage can import.
SOURCE_DIRS = ("benchlab", "model", "stages")


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_bf16_native() -> bool:
    """Whether the CPU computes bf16 natively (AVX-512 BF16 or AMX); without it autocast to bf16 is emulated."""
    return bool({"avx512_bf16", "amx_bf16"} & _cpu_flags())


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
    """A command's output, or None where it fails. git only reads: without GIT_OPTIONAL_LOCKS=0, `git status`
    refreshes the index and takes .git/index.lock, which a stage killed (or out of file size) would leave behind in
    the user's checkout."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True,
                             env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"}).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None


# The libraries besides torch (recorded as "torch") that a variant may run: the environment's key for each, and its
# distribution name. A change to any of them may change a timing, and so reruns the timing stages.
LIBRARIES = {"triton": "triton", "torchao": "torchao", "liger_kernel": "liger-kernel",
             "cut_cross_entropy": "cut-cross-entropy", "nvidia_ml_py": "nvidia-ml-py"}


def package_version(name: str) -> str | None:
    """The installed version of a distribution, from its metadata (importing it could load its kernels), or None
    when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def nccl_version() -> str | None:
    """NCCL's version as torch was built with it ("2.27.7"), where CUDA is available; else None."""
    if not torch.cuda.is_available():
        return None
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


# Kept in every record but left out of metrics/env.json, the file every timing and parity stage depends on: they
# name one machine, not what its timings depend on. platform.platform() holds the kernel's build string, which
# differs between two virtual machines of one kind ("...-fc-v1147-..." against "...-fc-v1252-...") and made a
# fresh clone on the committed results' kind of machine rerun every timing (issue 43).
NOT_TIMING = ("platform",)


def environment() -> dict:
    """Hardware and software a run was measured with; stable across runs on one machine."""
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_bf16_native": cpu_bf16_native(),
        # torch.compile on a CPU builds C++ with this compiler; without one, compiled variants are skipped.
        "cxx_compiler": shutil.which(os.environ.get("CXX", "g++")),
        "cuda_available": torch.cuda.is_available(),
        "cuda": torch.version.cuda,
        "gpu": None, "gpu_count": 0, "gpu_capability": None, "driver": None, "cudnn": None,
        "gpu_topology": None,  # `nvidia-smi topo -m`: how the GPUs are linked (NVLink NV#, PCIe PIX/PHB/SYS)
        **{key: package_version(name) for key, name in LIBRARIES.items()},  # None: not installed
        "nccl": nccl_version(),
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpu_count"] = torch.cuda.device_count()
        env["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        env["cudnn"] = torch.backends.cudnn.version()
        driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        env["driver"] = driver.splitlines()[0] if driver else None
        env["gpu_topology"] = _run(["nvidia-smi", "topo", "-m"])
    return env


def timing_environment() -> dict:
    """What on this machine decides a timing: environment() less NOT_TIMING."""
    return {key: value for key, value in environment().items() if key not in NOT_TIMING}


def source_sha256(root: Path = ROOT) -> str:
    """sha256 over the project's Python sources (path and bytes, in sorted order): the code that ran."""
    digest = hashlib.sha256()
    for folder in SOURCE_DIRS:
        for path in sorted((root / folder).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def tree_clean(root: Path = ROOT) -> bool | None:
    """Whether git sees no uncommitted change to the code a stage runs (SOURCE_DIRS); None outside a git checkout.

    params.yaml and dvc.yaml do not count: DVC records the params each stage read and reruns it when they
    change, so adding a variant leaves every result's code committed."""
    status = _run(["git", "-C", str(root), "status", "--porcelain", "--", *SOURCE_DIRS])
    if status is None:
        inside = _run(["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"])
        return True if inside == "true" else None
    return False


def provenance() -> dict:
    """The commit, source hash and time of a run; changes every run, so never a DVC dependency.

    BENCHLAB_GIT_COMMIT, when set, names the source commit of a run made in a
    copy of the tree (scripts/remote_gpu.sh sets it), whose own HEAD means nothing;
    the source hash shows whether the code that ran is that commit's.
    """
    return {
        "provenance.git_commit": os.environ.get("BENCHLAB_GIT_COMMIT") or _run(["git", "-C", str(ROOT), "rev-parse", "HEAD"]),
        "provenance.tree_clean": tree_clean(),
        "provenance.source_sha256": source_sha256(),
        "provenance.date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
