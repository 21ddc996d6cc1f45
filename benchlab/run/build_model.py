"""The model a run trains: the preset, its checks, and its shape, from params."""

import torch

from benchlab.core.errors import LabError, shown
from benchlab.core.params import Params, RunSettings
from model.gpt import GPT, PRESETS, GPTConfig, padded_vocab


def check_model(p: Params) -> None:
    """The preset exists and holds the context shape.block_size asks for."""
    if p.model not in PRESETS:
        raise LabError(f"model={shown(p.model)} is not valid; expected {', '.join(PRESETS)}")
    context = PRESETS[p.model].block_size
    if p.shape.block_size > context:
        raise LabError(f"shape.block_size={p.shape.block_size} is not valid; "
                       f"expected at most {context}, the context of model={p.model}")


def model_config(p: Params, settings: RunSettings, data_vocab: int, n_layer: int | None = None) -> GPTConfig:
    """The preset with the attention kernel and the data's vocabulary filled in (and `n_layer` layers, where given:
    the search's compiling ahead)."""
    check_model(p)
    preset = PRESETS[p.model]
    vocab = preset.vocab_size or padded_vocab(data_vocab)
    if data_vocab > vocab:
        raise LabError(
            f"model={p.model} has {vocab} token embeddings but the data has {data_vocab} tokens; "
            f"lower data.vocab_size to at most {vocab} and rerun prepare"
        )
    depth = {} if n_layer is None else {"n_layer": n_layer}
    return GPTConfig.from_name(p.model, vocab_size=vocab, attention=settings.attention, **depth)


def fresh_model(p: Params, settings: RunSettings, data_vocab: int, n_layer: int | None = None) -> GPT:
    """The same initial weights on every device: seeded init on the CPU (moved later by `apply_knobs.apply`)."""
    torch.manual_seed(p.seed)
    return GPT(model_config(p, settings, data_vocab, n_layer))


def model_shape(p: Params, settings: RunSettings, data_vocab: int) -> tuple[GPTConfig, int]:
    """The model's config and non-embedding parameter count, without allocating weights."""
    cfg = model_config(p, settings, data_vocab)
    with torch.device("meta"):
        return cfg, GPT(cfg).num_params()
