"""Activation checkpointing, the `checkpointing` step of `benchlab.run.apply_knobs.apply`: which of a block's
outputs backward keeps and which it recomputes, and how compiled, checkpointed blocks replay their random ops.

Selective checkpointing keeps what the matmuls and the attention kernel produce (the kernel's ops are its catalog
entry's, `benchlab.core.attention_kernels`) and recomputes the cheap ops between them.
"""

from functools import cache, partial

import torch
import torch._functorch.config

from benchlab.core.attention_kernels import saved_ops as attention_saved_ops
from benchlab.core.knobs import CUDA_GRAPH_MODES, RunSettings
from model.gpt import GPT


def _keep_matmuls(ctx: object, op: object, *args: object, **kwargs: object) -> object:
    """Selective checkpointing: save what matmuls and attention produce, recompute the rest."""
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if _saved(op) else CheckpointPolicy.PREFER_RECOMPUTE


# By name ("aten.mm.default"), so that a kernel's op need not be registered, nor its library installed, before a
# model that calls it runs. The attention kernels' own are their catalog's (`AttentionKernel.saved_ops`).
_SAVED_OPS = frozenset({"aten.mm.default", "aten.addmm.default", "aten.bmm.default"}) | attention_saved_ops()


@cache
def _saved(op: object) -> bool:
    """Whether selective checkpointing keeps this op's output (each op object named once, then looked up)."""
    return str(op) in _SAVED_OPS


def checkpoint_blocks(model: GPT, mode: str) -> None:
    """Wrap every block so backward recomputes it (full) or its cheap ops only (selective)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    kwargs = {} if mode == "full" else {"context_fn": partial(create_selective_checkpoint_contexts, _keep_matmuls)}
    for i, block in enumerate(model.blocks):
        # The wrapper strips its own prefix from state_dict keys, so checkpoints stay loadable.
        model.blocks[i] = checkpoint_wrapper(block, preserve_rng_state=False, **kwargs)


def rng_replay(settings: RunSettings) -> None:
    """How compiled, checkpointed blocks replay their random ops' state in backward (SDPA's kernels, flash or
    cuDNN, are tagged random: they take a dropout seed, unused here). torch's default wraps each such op in the
    CUDA-graph-safe `graphsafe_run_with_rng_state`, which torch 2.11's FX graph cache refuses: on the H200 every fresh
    process compiled `lean` again, 18 to 22 s of warm-up against the recipe's 2 s (`results/h200-cache/`;
    pytorch/pytorch #185562 makes it cacheable in later releases). Without CUDA graphs the plain
    `run_and_save_rng_state` pair serves as well and is cached; under them the graph-safe form stays, as torch
    requires. The flag is global and read when a graph is built (the first step after `apply`); every run sets it."""
    torch._functorch.config.graphsafe_rng_functionalization = (
        settings.activation_checkpointing == "none" or settings.compile_mode in CUDA_GRAPH_MODES)
