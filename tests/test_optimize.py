"""Where each optimization can run, and how outputs are written."""

from pathlib import Path

import pytest
import torch

from benchlab.config import RunSettings, TrainParams
from benchlab.io import atomic_path, write_json
from benchlab.optimize import make_optimizer, unsupported_reason

CUDA = torch.device("cuda")


def fake_gpu(monkeypatch: pytest.MonkeyPatch, name: str, capability: tuple[int, int], bf16: bool) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)


def test_bf16_and_tf32_refused_on_a_gpu_without_them(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpu(monkeypatch, "Tesla V100-SXM2-16GB", (7, 0), bf16=False)
    assert "has no bf16; use fp16" in unsupported_reason(RunSettings(precision="bf16"), CUDA)
    assert "compute capability 7.x" in unsupported_reason(RunSettings(precision="tf32"), CUDA)
    assert unsupported_reason(RunSettings(precision="fp16"), CUDA) is None


def test_everything_allowed_on_a_hopper_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpu(monkeypatch, "NVIDIA H200", (9, 0), bf16=True)
    for precision in ("fp32", "tf32", "fp16", "bf16"):
        assert unsupported_reason(RunSettings(precision=precision, attention="sdpa", fused_adamw=True), CUDA) is None


def test_cpu_refuses_gpu_only_modes() -> None:
    cpu = torch.device("cpu")
    assert unsupported_reason(RunSettings(precision="fp16"), cpu)
    assert unsupported_reason(RunSettings(precision="tf32"), cpu)
    assert unsupported_reason(RunSettings(precision="bf16", fused_adamw=True), cpu) is None


def test_optimizer_is_the_for_loop_baseline_or_the_fused_kernel() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    loop = make_optimizer(model, RunSettings(), TrainParams())
    fused = make_optimizer(model, RunSettings(fused_adamw=True), TrainParams())
    assert loop.defaults["foreach"] is False and not loop.defaults["fused"]
    assert fused.defaults["fused"] is True
    decayed, plain = loop.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decayed["params"]) and all(p.dim() < 2 for p in plain["params"])


def test_an_interrupted_write_leaves_no_file(tmp_path: Path) -> None:
    target = tmp_path / "result.json"
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target) as tmp:
            tmp.write_text('{"half": ')
            raise KeyboardInterrupt  # a kill in the middle of writing
    assert not target.exists() and list(tmp_path.iterdir()) == []
    write_json(target, {"ok": 1})
    assert target.read_text() == '{\n  "ok": 1\n}\n'
