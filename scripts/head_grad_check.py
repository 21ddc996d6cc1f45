"""How far each loss head's gradients stray from fp32's under bf16 autocast, on the CPU.

    python scripts/head_grad_check.py [--heads inline,onepass] --seed 0 > results/cpu-head-grads/seed0.md

A small GPT is trained for a few steps in fp32 (so its logits are not uniform), then one batch's gradients are
taken in fp32 with the inline head (the reference) and under bf16 autocast with each head named. For every
parameter it prints the relative error of the gradient, |g - g_fp32| / |g_fp32|, and its projection on the
reference, <g, g_fp32> / <g_fp32, g_fp32>: a head that biased the gradients' scale would move the projection
away from 1 by more than the rounding does. It checks the heads' arithmetic, not the GPU's kernels: on the CPU
`onepass` runs its rows in torch (`benchlab.run.heads.onepass.rows_in_torch`), which tests/unit/test_onepass.py compares with
liger-kernel's kernel on CUDA.
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchlab.run.heads.onepass import OnePassLoss  # noqa: E402
from benchlab.run.heads.standard import LossOnly  # noqa: E402
from model.gpt import GPT, GPTConfig  # noqa: E402

CFG = GPTConfig(n_layer=2, n_head=4, n_embd=128, block_size=128, vocab_size=8192)
USED_TOKENS = 512  # of the 8192: a skewed distribution, as real text's


def heads(model: GPT) -> dict[str, nn.Module]:
    return {"inline": LossOnly(model), "onepass": OnePassLoss(model, torch.bfloat16)}


def trained_model(seed: int, steps: int) -> tuple[GPT, torch.Tensor]:
    """A model after `steps` fp32 AdamW steps on random tokens, and a batch it has not seen."""
    torch.manual_seed(seed)
    model = GPT(CFG)
    data = torch.randint(0, USED_TOKENS, (24, CFG.block_size + 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        loss = LossOnly(model)(data[:8, :-1].contiguous(), data[:8, 1:].contiguous())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model, data[8:]


def gradients(model: GPT, head: nn.Module, batch: torch.Tensor, bf16: bool) -> dict[str, torch.Tensor]:
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = head(batch[:, :-1].contiguous(), batch[:, 1:].contiguous())
    loss.backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", default="inline,onepass", help="comma-separated: inline, onepass")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=30, help="fp32 training steps before the gradients are taken")
    args = parser.parse_args()
    model, batch = trained_model(args.seed, args.steps)
    known = heads(model)
    names = args.heads.split(",")
    if unknown := [n for n in names if n not in known]:
        sys.exit(f"head_grad_check.py: unknown head {', '.join(unknown)}; expected: {', '.join(known)}")
    reference = gradients(model, known["inline"], batch, bf16=False)
    print(f"torch {torch.__version__}, CPU; {CFG}; seed {args.seed}, {args.steps} fp32 steps, batch {tuple(batch.shape)}")
    print("| head | parameter | relative error | projection on fp32's |")
    print("| --- | --- | --- | --- |")
    for name in names:
        grads = gradients(model, known[name], batch, bf16=True)
        for param, ref in reference.items():
            err = float((grads[param] - ref).norm() / ref.norm())
            proj = float((grads[param] * ref).sum() / (ref * ref).sum())
            print(f"| {name} | {param} | {err:.5f} | {proj:.5f} |")


if __name__ == "__main__":
    main()
