"""optimizer=muon (benchlab/run/muon.py): Muon on the blocks' 2D weights only, AdamW on the rest, one optimizer to
the training step, its momentum warmed up."""

import pytest
import torch

from benchlab.core.knobs import RunSettings
from benchlab.core.sections import OptimParams
from benchlab.run.muon import MuonAdamW
from benchlab.run.optimizers import make_optimizer, set_lr
from benchlab.run.schedule import muon_momentum
from model.gpt import GPT, GPTConfig


def tiny() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.from_name("tiny", vocab_size=64))


def block_matrices(model: GPT) -> set[str]:
    return {n for n, p in model.named_parameters() if n.startswith("blocks.") and p.dim() == 2}


def test_muon_holds_the_blocks_2d_weights_and_adamw_the_rest() -> None:
    model = tiny()
    opt = make_optimizer(model, RunSettings(optimizer="muon"), OptimParams(lr=0.01))
    assert isinstance(opt, MuonAdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    on_muon = {names[id(p)] for g in opt.muon.param_groups for p in g["params"]}
    on_adamw = {names[id(p)] for g in opt.adamw.param_groups for p in g["params"]}
    assert on_muon == block_matrices(model) and len(on_muon) == 2 * 4  # qkv, proj, fc, proj in each of 2 blocks
    assert on_adamw == set(names.values()) - on_muon  # embeddings (the tied head), positions, the LayerNorms
    assert {"wte.weight", "wpe.weight", "ln_f.weight", "blocks.0.ln_1.weight"} <= on_adamw
    decayed = {names[id(p)] for g in opt.adamw.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decayed == {"wte.weight", "wpe.weight"}  # decay on matrices only, as make_optimizer's AdamW


def test_a_muon_step_moves_only_the_block_matrices_when_adamw_stands_still() -> None:
    model = tiny()
    opt = make_optimizer(model, RunSettings(optimizer="muon"), OptimParams(lr=0.01, weight_decay=0.0))
    for group in opt.adamw.param_groups:
        group["lr"] = 0.0
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    idx = torch.randint(0, 64, (2, 16))
    model(idx, idx)[1].backward()
    opt.step()
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved == block_matrices(model)


def test_the_schedule_sets_both_halves_and_the_momentum_warms_up() -> None:
    model = tiny()
    opt = make_optimizer(model, RunSettings(optimizer="muon"), OptimParams(lr=0.01))
    set_lr(opt, 0.005)  # type: ignore[arg-type]  # the training step's call, every step
    assert {g["lr"] for g in opt.param_groups} == {0.005} and len(opt.param_groups) == 3
    assert [muon_momentum(s) for s in (0, 150, 300, 1000)] == pytest.approx([0.85, 0.9, 0.95, 0.95])
    idx = torch.randint(0, 64, (2, 16))
    for _ in range(3):
        model(idx, idx)[1].backward()
        opt.step()
        opt.zero_grad()
    assert opt.muon.param_groups[0]["momentum"] == muon_momentum(2) and opt.steps == 3
    assert all(p.grad is None for p in model.parameters())
