"""A GPT-2 style decoder-only Transformer in one file.

Pre-LayerNorm blocks, learned position embeddings, a GELU MLP, input and
output embeddings tied, and GPT-2's initialisation. The model knows its
architecture and which attention kernel it uses, nothing else: precision,
compilation and the optimizer are applied from outside (benchlab/run/apply_knobs.py).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchlab.core.attention_kernels import ATTENTION_KERNELS, Attention  # the catalog declares the choices, once


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int  # the longest context the position table holds
    vocab_size: int | None = None  # None: taken from the data, padded to 64
    attention: Attention = "manual"

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "block_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"GPTConfig.{name} must be positive, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}; "
                "choose a head count that divides the width"
            )
        if self.attention not in ATTENTION_KERNELS:
            raise ValueError(f"attention={self.attention!r}; valid: {', '.join(ATTENTION_KERNELS)}")

    @classmethod
    def from_name(cls, name: str, **overrides: object) -> "GPTConfig":
        """A named preset, with fields replaced by `overrides`."""
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; valid: {', '.join(PRESETS)}")
        return replace(PRESETS[name], **overrides)  # type: ignore[arg-type]


PRESETS: dict[str, GPTConfig] = {
    # Seconds per run on a laptop CPU; the default for the CPU pipeline.
    "tiny": GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=128),
    # A few minutes per thousand steps on one CPU core, seconds on a GPU:
    # 4 layers, 4 heads, 256 wide, 256 context (about 4M parameters with the
    # default 4096-token vocabulary).
    "gpt_small": GPTConfig(n_layer=4, n_head=4, n_embd=256, block_size=256),
    # GPT-2 small. 50257 tokens padded to 50304, a multiple of 64, as nanoGPT
    # does ("~25% faster" matmuls on the output layer).
    "gpt2_124m": GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304),
    # GPT-2 medium.
    "gpt2_350m": GPTConfig(n_layer=24, n_head=16, n_embd=1024, block_size=1024, vocab_size=50304),
    # GPT-2 large and XL: the sizes people train on one GPU, where the scale axis ends.
    "gpt2_774m": GPTConfig(n_layer=36, n_head=20, n_embd=1280, block_size=1024, vocab_size=50304),
    "gpt2_1558m": GPTConfig(n_layer=48, n_head=25, n_embd=1600, block_size=1024, vocab_size=50304),
}


def padded_vocab(n: int, multiple: int = 64) -> int:
    """Round a tokenizer's vocabulary up to a multiple of 64 for matmul-friendly shapes."""
    return ((n + multiple - 1) // multiple) * multiple


# The attention kernels: q, k, v (B, nh, T, hs) -> y (B, nh, T, hs), each position attending to itself and the
# positions before it. `future` is the causal mask, True above the diagonal, or None for a kernel that reads none.


def manual_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, future: torch.Tensor | None) -> torch.Tensor:
    """The causal-masked softmax written out: the (T, T) scores are made, masked and kept for backward."""
    assert future is not None
    T = q.size(-2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, nh, T, T)
    att = att.masked_fill(future[:, :, :T, :T], float("-inf"))
    att = F.softmax(att, dim=-1)
    return att @ v  # (B, nh, T, hs)


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, future: torch.Tensor | None) -> torch.Tensor:
    """torch's scaled_dot_product_attention, causal by itself: it picks a fused kernel for the device."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Kernel(NamedTuple):
    """An attention kernel as the model runs it."""

    forward: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
    masked: bool = False  # reads `future`: only its layers hold the mask (block_size² bools each)


# The forward of each choice of the attention knob; what the rest of a run knows of it is its catalog entry
# (benchlab/core/attention_kernels.py).
ATTENTION: dict[str, Kernel] = {"manual": Kernel(manual_attention, masked=True), "sdpa": Kernel(sdpa_attention)}
if tuple(ATTENTION) != tuple(ATTENTION_KERNELS):  # a bug in this module, found on import
    raise ValueError(f"ATTENTION {tuple(ATTENTION)} must name the kernels of ATTENTION_KERNELS, "
                     f"{tuple(ATTENTION_KERNELS)}")


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)  # adds into the residual stream
        kernel = ATTENTION[cfg.attention]
        self.attend = kernel.forward
        if kernel.masked:  # True above the diagonal: the future positions each query must not see.
            future = torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool).triu(diagonal=1)
            self.register_buffer("future", future.view(1, 1, cfg.block_size, cfg.block_size), persistent=False)
        else:
            self.register_buffer("future", None, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        y = self.attend(q, k, v, self.future)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=False)  # adds into the residual stream

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=False)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=False)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        if cfg.vocab_size is None:
            raise ValueError("GPTConfig.vocab_size is unset; fill it from the data before building the model")
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=False)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2
        self._init_weights()

    def _init_weights(self) -> None:
        # GPT-2: N(0, 0.02), and the projections that add into the residual
        # stream (named `proj`) scaled by 1/sqrt(2 * n_layer) so its variance stays put.
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = 0.02 / math.sqrt(2 * self.cfg.n_layer) if name.endswith(".proj") else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; position embeddings left out by default, as in MFU formulas."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.wpe.weight.numel() if non_embedding else n

    def features(self, idx: torch.Tensor) -> torch.Tensor:
        """The final hidden states (B, T, C), after the last LayerNorm: what the output layer reads."""
        B, T = idx.shape
        if T > self.cfg.block_size:
            raise ValueError(f"sequence of {T} tokens exceeds block_size={self.cfg.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (B, T, vocab) and, given targets, the mean cross-entropy."""
        logits = self.lm_head(self.features(idx))  # (B, T, vocab)
        if targets is None:
            return logits, None
        # Under autocast cross_entropy runs in fp32 by itself; no upcast copy of the logits here.
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss
