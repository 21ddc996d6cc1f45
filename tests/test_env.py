"""The environment record (benchlab/env.py) that every timing stage depends on: a library's version in it."""

import importlib.metadata

import pytest

from benchlab import env

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
