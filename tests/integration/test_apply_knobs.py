"""`benchlab.run.apply_knobs` for a few steps: the one-call bf16 AdamW with stochastic rounding against torchao's,
and the compiled optimizer step against the eager one under a schedule (torch.compile builds C++ kernels). The rest
of apply is tested in tests/unit/test_apply_knobs.py."""

import pytest
import torch
import torch._functorch.config

from benchlab.core.knobs import RunSettings
from benchlab.core.sections import OptimParams
from benchlab.run import apply_knobs
from benchlab.run.apply_knobs import apply
from benchlab.run.optimizers import set_lr
from benchlab.run.step import train_step
from model.gpt import GPT, GPTConfig
from tests.unit import test_apply_knobs as unit
from tests.unit.test_apply_knobs import _batch, _tiny


# The other case of the unit test of this name: adamw_bf16_sr, whose step torch.compile builds.
@pytest.mark.integration
@pytest.mark.parametrize("optimizer", ["adamw_bf16_sr"])
def test_updates_below_bf16s_resolution_survive_only_stochastic_rounding(optimizer: str) -> None:
    unit.test_updates_below_bf16s_resolution_survive_only_stochastic_rounding(optimizer)


def _one_layer() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32))


@pytest.mark.integration
def test_one_call_step_is_torchaos_step_over_every_parameter() -> None:
    # Without the rounding (fp32 weights) the one compiled call and torchao's per-parameter calls run the same
    # arithmetic, so three steps land on the same weights; each step is one call per group, not one per parameter.
    pytest.importorskip("torchao")
    from torchao.optim import _AdamW

    from benchlab.run.adamw_bf16_sr import OneCallAdamW

    g = torch.Generator().manual_seed(2)
    grads = [[torch.randn(p.shape, generator=g) for p in _one_layer().parameters()] for _ in range(3)]
    weights = {}
    calls: list[int] = []
    for kind in ("torchao", "one call"):
        model = _one_layer()
        params = list(model.parameters())
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        if kind == "torchao":
            opt: torch.optim.Optimizer = _AdamW(groups, lr=0.01, betas=(0.9, 0.95))
        else:
            opt = OneCallAdamW(groups, lr=0.01, betas=(0.9, 0.95), bf16_stochastic_round=False)
            real = opt.step_group
            opt.step_group = lambda *a, _r=real: (calls.append(1), _r(*a))[1]  # type: ignore[attr-defined]
        for step_grads in grads:
            for p, grad in zip(params, step_grads):
                p.grad = grad.clone()
            opt.step()
        weights[kind] = [p.detach().clone() for p in params]
        assert [float(opt.state[params[0]]["step"])] == [3.0]
    assert len(calls) == 3 * 2  # three steps, two groups
    for a, b in zip(weights["torchao"], weights["one call"]):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)
    assert not torch.equal(weights["one call"][0], _one_layer().wte.weight)  # the steps moved the weights


def _weights_under_a_schedule(settings: RunSettings, lrs: tuple[float, ...]) -> tuple[list[torch.Tensor], int]:
    """The weights after one clipped step per learning rate, and how many graphs dynamo compiled meanwhile."""
    run = apply(_tiny(), settings, torch.device("cpu"), OptimParams(lr=lrs[0]))
    graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for lr in lrs:
        set_lr(run.optimizer, lr)
        train_step(run, *_batch(), grad_clip=0.05)  # the tiny model's gradient norm is about 1: clipped
    return [p.detach().clone() for p in run.model.parameters()], \
        torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs_before


@pytest.mark.integration
def test_compiled_update_steps_as_the_eager_one_and_follows_the_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the update is compiled here (its check asks for compile; the model's compile would only slow the test).
    monkeypatch.setattr(apply_knobs, "why_not", lambda settings, device: None)
    lrs = (0.01, 0.03, 0.002)
    eager, none = _weights_under_a_schedule(RunSettings(), lrs)
    compiled, graphs = _weights_under_a_schedule(RunSettings(optimizer="adamw_compiled"), lrs)
    constant, _ = _weights_under_a_schedule(RunSettings(), (0.01, 0.01, 0.01))
    for a, b in zip(eager, compiled):  # the same arithmetic, fused by inductor: equal up to rounding
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    assert max((a - b).abs().max().item() for a, b in zip(compiled, constant)) > 1e-3  # the schedule was followed
    # Clipping and the step, compiled once each: a rate held as a float would be compiled again when it first changes.
    assert none == 0 and graphs == 2
