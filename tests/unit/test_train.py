"""A training run's bookkeeping: timing after warm-up, a NaN or out-of-memory run's status, the schedule, the batch
size, and memory knobs as exact rewrites of the same step. Learning itself is in tests/integration/test_train.py."""

import math
from dataclasses import replace

import pytest
import torch

from benchlab.core.params import Params, RunSettings
from benchlab.core.sections import OptimParams
from benchlab.run.apply_knobs import apply
from benchlab.run.runner import train_once
from benchlab.run.schedule import lr_at
from benchlab.run.step import train_step
from model.gpt import GPT, GPTConfig

CPU = torch.device("cpu")


def run(params: Params, tokens, steps: int = 12, **settings: object):
    return train_once(params, RunSettings(**settings), tokens, CPU, steps=steps, warmup=2)


def test_run_records_timing_of_steps_after_warmup(params: Params, tokens) -> None:
    rec = run(params, tokens, steps=8)
    assert len(rec.step_ms) == 8 and len(rec.timed_ms) == 6 and all(t > 0 for t in rec.step_ms)
    assert rec.warmup_s is not None and rec.warmup_s > 0
    assert rec.setup_s is not None and rec.setup_s > 0 and rec.eval_s is not None and rec.eval_s > 0
    assert rec.init_s is not None and 0 < rec.init_s < rec.setup_s  # the seeded init is a part of the build
    assert rec.apply_s is not None and 0 < rec.apply_s < rec.setup_s  # and the knobs' application the rest
    assert rec.init_s + rec.apply_s == pytest.approx(rec.setup_s)
    assert rec.memory["peak_rss_mb"] > 0 and rec.memory["peak_mem_allocated_mb"] is None  # CPU: RSS only


def test_nan_loss_stops_the_run_as_diverged_with_its_step(params: Params, tokens) -> None:
    p = replace(params, optim=replace(params.optim, lr=1e9, lr_warmup_steps=0, grad_clip=0.0))
    rec = run(p, tokens, steps=12)
    assert rec.status == "diverged"
    assert rec.diverged_step is not None and rec.diverged_step < 11
    assert len(rec.losses) == rec.diverged_step + 1  # stopped within one step of the NaN
    assert not math.isfinite(rec.losses[-1])


def test_out_of_memory_becomes_a_status(params: Params, tokens, monkeypatch: pytest.MonkeyPatch) -> None:
    def oom(*args: object, **kwargs: object) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr("benchlab.run.runner.train_step", oom)
    rec = run(params, tokens)
    assert rec.status == "oom"
    assert "batch size 4" in rec.message and rec.message.endswith("more was asked for")


def test_learning_rate_warms_up_then_decays_to_the_floor(params: Params) -> None:
    p = replace(params, optim=replace(params.optim, lr=1.0, min_lr=0.1, lr_warmup_steps=4))
    lrs = [lr_at(s, 20, p.optim, p.run) for s in range(20)]
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert lrs[-1] == pytest.approx(0.1) and all(a >= b for a, b in zip(lrs[3:], lrs[4:]))


def _loss_and_grads(settings: RunSettings) -> tuple[float, dict]:
    """One training step's loss and the gradients it left, on a fixed tiny model and batch."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, attention="sdpa"))
    run = apply(model, settings, CPU, OptimParams())
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g)
    grads: dict = {}
    real_step = run.optimizer.step
    run.optimizer.step = lambda *a, **k: (grads.update({n.replace("_checkpoint_wrapped_module.", ""): p.grad.clone()
                                                        for n, p in run.model.named_parameters()}),
                                          real_step(*a, **k))[1]
    loss = train_step(run, x, y, grad_clip=0.0, micro_batches=settings.grad_accum)
    assert set(run.model.state_dict()) == set(grads) | {"lm_head.weight"}  # checkpoints keep the plain keys
    return float(loss), grads


@pytest.mark.parametrize("settings", [
    {"activation_checkpointing": "full"},
    {"activation_checkpointing": "selective"},
    {"loss": "chunked", "loss_chunk_tokens": 24},  # 64 tokens: two full chunks and a ragged one
    {"loss": "inline"},
    {"loss": "onepass"},
    {"grad_accum": 2, "loss": "onepass"},
    {"grad_accum": 2},
    {"grad_accum": 4, "activation_checkpointing": "selective", "loss": "chunked", "loss_chunk_tokens": 6},
    {"grad_accum": 2, "activation_checkpointing": "full", "loss": "chunked", "loss_chunk_tokens": 7},
])
def test_memory_knobs_are_exact_rewrites_of_the_same_step(settings: dict) -> None:
    # Checkpointing recomputes the same ops, the chunked loss sums the same terms, and accumulation
    # averages equal micro-batches: same loss and gradients up to float rounding (1e-5 relative).
    base_loss, base_grads = _loss_and_grads(RunSettings(attention="sdpa"))
    loss, grads = _loss_and_grads(RunSettings(attention="sdpa", **settings))
    assert loss == pytest.approx(base_loss, rel=1e-5)
    assert grads.keys() == base_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, base_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_a_variant_batch_size_sets_the_tokens_per_step(params: Params, tokens) -> None:
    rec = train_once(params, RunSettings(batch_size=8, grad_accum=2), tokens, CPU, steps=4, warmup=2)
    assert rec.status == "ok"
    from benchlab.run.records import base_record
    base = base_record("v", params, RunSettings(batch_size=8), "cpu", {}, {})
    assert base["batch_size"] == 8 and base["tokens_per_step"] == 8 * params.shape.block_size
