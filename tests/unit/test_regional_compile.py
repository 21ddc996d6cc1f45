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
from model.gpt import GPT, GPTConfig


def _model(layers: int = 2) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=layers, n_head=2, n_embd=32, block_size=16, vocab_size=64))


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


def test_screening_runs_compile_blocks_only_where_asked_and_the_candidate_compiles_without_cuda_graphs() -> None:
    from benchlab.search.worker import screening_settings

    compiled = RunSettings(compile=True)
    assert screening_settings(compiled, "blocks").compile_scope == "blocks"
    assert screening_settings(compiled, "model") == compiled
    assert screening_settings(RunSettings(), "blocks") == RunSettings()  # eager: nothing to compile
    graphs = RunSettings(compile=True, compile_mode="reduce-overhead")
    assert screening_settings(graphs, "blocks") == graphs  # CUDA graphs: whole-model compilation
