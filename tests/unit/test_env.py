"""The environment (benchlab/run/env.py): what every result record carries, and the part of it every timing stage
depends on (metrics/env.json): a library's version in it, the kernel's build string not."""

import importlib.metadata
import json
from pathlib import Path

import pytest

from benchlab.core.knobs import RunSettings
from benchlab.run import env
from benchlab.run.records import base_record
from stages import env as stages_env

LIBRARY_KEYS = ("torch", "triton", "torchao", "liger_kernel", "cut_cross_entropy", "nvidia_ml_py", "nccl")


def test_every_library_a_variant_may_use_has_its_version_recorded() -> None:
    record = env.environment()
    assert set(LIBRARY_KEYS) <= record.keys()
    assert record["torchao"] == importlib.metadata.version("torchao")  # installed with requirements.txt
    assert record["torch"] == importlib.metadata.version("torch")


def test_a_missing_library_records_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(env.LIBRARIES, "liger_kernel", "no-such-distribution-benchlab")
    assert env.environment()["liger_kernel"] is None
    assert env.package_version("no-such-distribution-benchlab") is None


def test_a_version_change_changes_the_record(monkeypatch: pytest.MonkeyPatch) -> None:
    # The env stage's output must differ, so that DVC reruns the timing stages that depend on it.
    before = env.environment()
    real = env.package_version
    monkeypatch.setattr(env, "package_version", lambda name: "99.0.0" if name == "liger-kernel" else real(name))
    after = env.environment()
    assert after["liger_kernel"] == "99.0.0" != before["liger_kernel"]
    assert {k: v for k, v in after.items() if k != "liger_kernel"} == {
        k: v for k, v in before.items() if k != "liger_kernel"}


def test_nccl_version_only_where_cuda_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env.torch.cuda, "is_available", lambda: False)
    assert env.nccl_version() is None
    monkeypatch.setattr(env.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(env.torch.cuda.nccl, "version", lambda: (2, 27, 7))
    assert env.nccl_version() == "2.27.7"


KERNELS = ("Linux-6.18.44-fc-v1147-x86_64-with-glibc2.36", "Linux-6.18.44-fc-v1252-x86_64-with-glibc2.36")


def env_json(out: Path) -> bytes:
    """The bytes the env stage writes on this (patched) machine: what every timing and parity stage depends on."""
    stages_env.main([str(out)])
    return out.read_bytes()


def test_two_machines_of_one_kind_differing_in_the_kernel_build_give_the_same_env_json(
        workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written = []
    for kernel in KERNELS:
        monkeypatch.setattr(env.platform, "platform", lambda kernel=kernel: kernel)
        written.append(env_json(workdir / f"{kernel}.json"))
        assert env.environment()["platform"] == kernel  # every result record keeps it, for provenance
    assert written[0] == written[1]
    assert b"fc-v" not in written[0]


def test_a_different_cpu_model_or_torch_version_gives_a_different_env_json(
        workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here = env_json(workdir / "here.json")
    monkeypatch.setattr(env, "_cpu_model", lambda: "Another CPU")
    other_cpu = env_json(workdir / "other-cpu.json")
    monkeypatch.setattr(env.torch, "__version__", "9.9.9+cpu")
    other_torch = env_json(workdir / "other-torch.json")
    assert json.loads(other_cpu) == {**json.loads(here), "cpu": "Another CPU"}
    assert json.loads(other_torch) == {**json.loads(other_cpu), "torch": "9.9.9+cpu"}


def test_a_record_keeps_the_platform_the_env_json_leaves_out(params, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env.platform, "platform", lambda: KERNELS[0])
    record = base_record("fp32_baseline", params, RunSettings(), "cpu", env.environment(), {})
    assert record["env.platform"] == KERNELS[0]  # benchlab/analysis/run_report.py reads it
    assert env.timing_environment() == {k: v for k, v in env.environment().items() if k not in env.NOT_TIMING}
    assert "platform" not in env.timing_environment()


def test_git_is_asked_only_to_read_the_checkout(monkeypatch) -> None:
    seen: list[dict] = []
    real = env.subprocess.run

    def spy(cmd, **kw):
        seen.append(kw.get("env") or {})
        return real(cmd, **kw)

    monkeypatch.setattr(env.subprocess, "run", spy)
    env.tree_clean()
    assert seen and all(e.get("GIT_OPTIONAL_LOCKS") == "0" for e in seen)


def test_the_source_hash_and_the_clean_check_read_the_project_s_own_sources() -> None:
    # env.py's place in the tree names the root: a wrong one would hash no file and call any edit committed.
    import hashlib

    from tests.conftest import ROOT

    assert env.ROOT == ROOT and (env.ROOT / "benchlab" / "run" / "env.py").is_file()
    assert env.source_sha256() != hashlib.sha256().hexdigest()
