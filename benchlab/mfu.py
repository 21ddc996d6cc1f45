"""Model FLOPs utilization: achieved training FLOP/s over the device's peak.

FLOPs per token = 6 N + 12 L d T (Kaplan et al. 2020; PaLM appendix B):
6 N for the forward and backward matmuls through N parameters (position
embeddings excluded: a lookup, not a matmul; the tied token embedding counted
once, as the output layer), plus 12 L d T for attention's QK^T and AV
products over a context of T. GPT-2 124M at T=1024: about 854 MFLOP/token.

The peak is the GPU's dense bf16 tensor-core rate from the vendor datasheet,
whatever precision the run uses (as nanoGPT and torchtitan report MFU), so
fp32 and bf16 rows are on one scale. Unknown devices, CPUs included, get no
MFU rather than a guessed one.
"""

from model.gpt import GPTConfig

# Dense (no sparsity) bf16 tensor-core TFLOP/s, vendor datasheets. Checked in
# order; the first name found in torch.cuda.get_device_name() wins.
PEAK_BF16_TFLOPS: list[tuple[str, float]] = [
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
]


def flops_per_token(cfg: GPTConfig, non_embedding_params: int, seq_len: int) -> float:
    """Training FLOPs per token: 6N + 12 L d T."""
    return 6.0 * non_embedding_params + 12.0 * cfg.n_layer * cfg.n_embd * seq_len


def peak_tflops(device_name: str | None) -> float | None:
    """The datasheet dense bf16 peak for a device name, or None when we have no sourced figure."""
    if not device_name:
        return None
    for key, tflops in PEAK_BF16_TFLOPS:
        if key in device_name:
            return tflops
    return None


def mfu_pct(tokens_per_sec: float, flops_tok: float, peak: float | None) -> float | None:
    if peak is None:
        return None
    return 100.0 * tokens_per_sec * flops_tok / (peak * 1e12)
