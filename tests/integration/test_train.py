"""Training runs: the model learns, runs repeat exactly, and every optimization learns the same."""

import math
from dataclasses import replace

import pytest

from benchlab.core.params import Params, parse_params
from tests.conftest import micro_params
from tests.unit.test_train import run


@pytest.mark.integration
def test_loss_falls_on_the_tiny_preset(tokens) -> None:
    p = parse_params(micro_params(optim__lr=3e-3))
    rec = run(p, tokens, steps=40)
    assert rec.status == "ok"
    first, last = sum(rec.losses[:5]) / 5, sum(rec.losses[-5:]) / 5
    assert last < first - 0.5, (first, last)
    assert rec.losses[0] == pytest.approx(math.log(512), abs=0.3)  # starts near uniform


@pytest.mark.integration
def test_same_seed_gives_a_bit_identical_loss_curve(params: Params, tokens) -> None:
    a, b = run(params, tokens), run(params, tokens)
    assert a.losses == b.losses and a.val_loss == b.val_loss


@pytest.mark.integration
def test_another_seed_gives_another_curve(params: Params, tokens) -> None:
    other = replace(params, seed=params.seed + 1)
    assert run(params, tokens).losses != run(other, tokens).losses


@pytest.mark.integration
@pytest.mark.parametrize("settings, tol", [
    ({"attention": "sdpa"}, 1e-4),
    ({"optimizer": "adamw_fused"}, 1e-4),
    ({"precision": "bf16"}, 0.05),  # bf16 keeps 8 mantissa bits: close, not equal
])
def test_each_optimization_learns_the_same_as_the_baseline(params: Params, tokens, settings: dict, tol: float) -> None:
    base = run(params, tokens)
    other = run(params, tokens, **settings)
    assert other.status == "ok"
    for a, b in zip(base.losses, other.losses):
        assert abs(a - b) <= tol * max(1.0, abs(a)), (base.losses, other.losses)
    assert abs(base.val_loss - other.val_loss) <= tol * 2


@pytest.mark.integration
def test_compiled_model_learns_the_same(params: Params, tokens) -> None:
    base = run(params, tokens, steps=4)
    compiled = run(params, tokens, steps=4, compile=True)
    assert compiled.status == "ok"
    assert compiled.losses == pytest.approx(base.losses, rel=1e-4)
