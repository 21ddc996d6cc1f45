"""The install files: every pin exact, torch pinned for the CPU install only, and liger-kernel at onepass's version."""

import re
from pathlib import Path

from benchlab.run.heads.onepass import LIGER_VERSION

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"([A-Za-z0-9._-]+)==([A-Za-z0-9.+!-]+)")


def pins(name: str) -> dict[str, str]:
    """A requirements file's `name==version` lines, following its `-r` includes; any other line fails."""
    found: dict[str, str] = {}
    for raw in (ROOT / name).read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r "):
            found.update(pins(line.removeprefix("-r ").strip()))
            continue
        match = PIN.fullmatch(line)
        assert match, f"{name}: {raw!r} is not an exact pin"
        found[match[1].lower()] = match[2]
    return found


def test_liger_pin_is_the_version_onepass_was_written_against() -> None:
    assert pins("requirements-gpu.txt")["liger-kernel"] == LIGER_VERSION


def test_gpu_file_pins_every_gpu_extra_and_never_torch() -> None:
    gpu = pins("requirements-gpu.txt")
    # torch from PyPI would replace the CUDA build it is installed on top of.
    assert "torch" not in gpu
    assert {"liger-kernel", "cut-cross-entropy", "nvidia-ml-py", "torchao"} <= gpu.keys()


def test_cpu_install_is_torch_plus_the_same_base_as_the_gpu_install() -> None:
    base = pins("requirements-base.txt")
    cpu, gpu = pins("requirements.txt"), pins("requirements-gpu.txt")
    assert "torch" not in base
    assert cpu == {**base, "torch": cpu["torch"]}
    assert {k: gpu[k] for k in base} == base
    assert "requirements.txt" in (ROOT / "requirements-test.txt").read_text()  # CI's install includes it
