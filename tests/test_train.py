"""Training runs: the model learns, runs repeat exactly, and every optimization learns the same."""

import math
from dataclasses import replace

import pytest
import torch

from benchlab.config import Params, RunSettings, parse
from benchlab.runner import lr_at, train_once
from tests.conftest import micro_params

CPU = torch.device("cpu")


def run(params: Params, tokens, steps: int = 12, **settings: object):
    return train_once(params, RunSettings(**settings), tokens, CPU, steps=steps, warmup=2)


def test_loss_falls_on_the_tiny_preset(tokens) -> None:
    p = parse(Params, micro_params(train__lr=3e-3))
    rec = run(p, tokens, steps=40)
    assert rec.status == "ok"
    first, last = sum(rec.losses[:5]) / 5, sum(rec.losses[-5:]) / 5
    assert last < first - 0.5, (first, last)
    assert rec.losses[0] == pytest.approx(math.log(512), abs=0.3)  # starts near uniform


def test_same_seed_gives_a_bit_identical_loss_curve(params: Params, tokens) -> None:
    a, b = run(params, tokens), run(params, tokens)
    assert a.losses == b.losses and a.val_loss == b.val_loss


def test_another_seed_gives_another_curve(params: Params, tokens) -> None:
    other = replace(params, seed=params.seed + 1)
    assert run(params, tokens).losses != run(other, tokens).losses


@pytest.mark.parametrize("settings, tol", [
    ({"attention": "sdpa"}, 1e-4),
    ({"fused_adamw": True}, 1e-4),
    ({"precision": "bf16"}, 0.05),  # bf16 keeps 8 mantissa bits: close, not equal
])
def test_each_optimization_learns_the_same_as_the_baseline(params: Params, tokens, settings: dict, tol: float) -> None:
    base = run(params, tokens)
    other = run(params, tokens, **settings)
    assert other.status == "ok"
    for a, b in zip(base.losses, other.losses):
        assert abs(a - b) <= tol * max(1.0, abs(a)), (base.losses, other.losses)
    assert abs(base.val_loss - other.val_loss) <= tol * 2


def test_compiled_model_learns_the_same(params: Params, tokens) -> None:
    base = run(params, tokens, steps=4)
    compiled = run(params, tokens, steps=4, compile=True)
    assert compiled.status == "ok"
    assert compiled.losses == pytest.approx(base.losses, rel=1e-4)


def test_run_records_timing_of_steps_after_warmup(params: Params, tokens) -> None:
    rec = run(params, tokens, steps=8)
    assert len(rec.step_ms) == 8 and len(rec.timed_ms) == 6 and all(t > 0 for t in rec.step_ms)
    assert rec.warmup_s is not None and rec.warmup_s > 0
    assert rec.memory["peak_rss_mb"] > 0 and rec.memory["peak_mem_allocated_mb"] is None  # CPU: RSS only


def test_nan_loss_stops_the_run_as_diverged_with_its_step(params: Params, tokens) -> None:
    p = replace(params, train=replace(params.train, lr=1e9, lr_warmup_steps=0, grad_clip=0.0))
    rec = run(p, tokens, steps=12)
    assert rec.status == "diverged"
    assert rec.diverged_step is not None and rec.diverged_step < 11
    assert len(rec.losses) == rec.diverged_step + 1  # stopped within one step of the NaN
    assert not math.isfinite(rec.losses[-1])


def test_out_of_memory_becomes_a_status(params: Params, tokens, monkeypatch: pytest.MonkeyPatch) -> None:
    def oom(*args: object, **kwargs: object) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr("benchlab.runner.train_step", oom)
    rec = run(params, tokens)
    assert rec.status == "oom"
    assert "train.batch_size=4" in rec.message and "Tried to allocate" in rec.message


def test_learning_rate_warms_up_then_decays_to_the_floor(params: Params) -> None:
    p = replace(params, train=replace(params.train, lr=1.0, min_lr=0.1, lr_warmup_steps=4))
    lrs = [lr_at(s, 20, p) for s in range(20)]
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert lrs[-1] == pytest.approx(0.1) and all(a >= b for a, b in zip(lrs[3:], lrs[4:]))
