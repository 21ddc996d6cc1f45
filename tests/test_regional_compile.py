"""compile_scope=blocks (regional compilation, benchlab/run/apply_knobs.py): each block's forward compiled on its
own and the output layer with its loss apart; the same function as the whole model compiled, a graph compiled
once for every block, and the combinations it cannot take refused when params load."""

import pytest
import torch

from benchlab.core.errors import LabError
from benchlab.core.knobs import RunSettings, check_combination
from benchlab.core.sections import OptimParams
from benchlab.run import apply_knobs
from benchlab.run.apply_knobs import apply, blocks_compiled
from benchlab.run.heads.standard import BodyThenHead
from benchlab.run.step import train_step
from model.gpt import GPT, GPTConfig


def _model(layers: int = 2) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=layers, n_head=2, n_embd=32, block_size=16, vocab_size=64))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g)


def test_blocks_scope_compiles_each_block_and_the_head_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apply_knobs, "why_not", lambda settings, device: None)
    run = apply(_model(), RunSettings(compile=True, compile_scope="blocks"), torch.device("cpu"), OptimParams())
    assert all(hasattr(block.forward, "_torchdynamo_orig_callable") for block in run.model.blocks)
    assert isinstance(run.loss, BodyThenHead)  # the output layer and its loss: one graph of their own
    whole = apply(_model(), RunSettings(compile=True), torch.device("cpu"), OptimParams())
    assert not any(hasattr(block.forward, "_torchdynamo_orig_callable") for block in whole.model.blocks)
    assert not isinstance(whole.loss, BodyThenHead)
    assert [blocks_compiled(s) for s in (RunSettings(compile=True, compile_scope="blocks"), RunSettings(compile=True),
                                         RunSettings(compile=True, parallel="fsdp2", nproc=2))] == [True, False, True]


@pytest.mark.parametrize("bad, message", [
    (dict(compile_scope="blocks"), "compile_scope='blocks' is not valid; expected model unless compile=true"),
    (dict(compile=True, compile_scope="blocks", compile_mode="reduce-overhead"),
     "compile_scope='blocks' is not valid; expected model with compile_mode=reduce-overhead (CUDA graphs over blocks "
     "compiled one by one are broken in torch 2.11, pytorch/pytorch#152887"),
    (dict(compile=True, compile_scope="blocks", compile_mode="max-autotune"), "model with compile_mode=max-autotune")])
def test_what_regional_compilation_cannot_take_is_refused_when_params_load(bad: dict, message: str) -> None:
    with pytest.raises(LabError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_combination("variants.x.", RunSettings(**bad), 16)
    check_combination("", RunSettings(compile=True, compile_scope="blocks", compile_mode="max-autotune-no-cudagraphs"),
                      16)


def _losses(settings: RunSettings, layers: int, steps: int = 3) -> tuple[list[float], int]:
    torch._dynamo.reset()
    graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    run = apply(_model(layers), settings, torch.device("cpu"), OptimParams(lr=0.01))
    losses = [float(train_step(run, *_batch(), grad_clip=1.0)) for _ in range(steps)]
    return losses, torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs_before


@pytest.mark.integration
def test_regional_and_whole_model_compilation_train_the_same_and_a_block_compiles_once() -> None:
    eager, _ = _losses(RunSettings(), 3)
    whole, _ = _losses(RunSettings(compile=True), 3)
    regional, graphs = _losses(RunSettings(compile=True, compile_scope="blocks"), 3)
    deeper, deeper_graphs = _losses(RunSettings(compile=True, compile_scope="blocks"), 5)
    torch.testing.assert_close(regional, whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(regional, eager, rtol=1e-5, atol=1e-5)
    assert deeper != regional  # a deeper model: other losses, the same graphs
    assert graphs == deeper_graphs  # a block's graph is compiled once, whatever the depth


def test_screening_runs_compile_blocks_only_where_asked_and_the_candidate_compiles_without_cuda_graphs() -> None:
    from benchlab.search.worker import screening_settings

    compiled = RunSettings(compile=True)
    assert screening_settings(compiled, "blocks").compile_scope == "blocks"
    assert screening_settings(compiled, "model") == compiled
    assert screening_settings(RunSettings(), "blocks") == RunSettings()  # eager: nothing to compile
    graphs = RunSettings(compile=True, compile_mode="reduce-overhead")
    assert screening_settings(graphs, "blocks") == graphs  # CUDA graphs: whole-model compilation
