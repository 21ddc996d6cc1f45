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

import re

from model.gpt import GPTConfig

# Dense (no 2:4 sparsity) bf16 tensor-core TFLOP/s, each the vendor's datasheet figure for that card: the
# datasheets quote sparse rates first, so the dense one is the figure before "with sparsity" or half of it.
# GeForce cards run bf16 with fp32 accumulation, what torch's matmuls use, at half their fp16-accumulate rate;
# their whitepapers list both, and the fp32-accumulate one is taken here.
# Each pattern is searched for in torch.cuda.get_device_name(); the first that matches wins. Word boundaries keep
# "L4" from matching "L40S", "A10" from "A100" or "A10G", "H200" from "GH200"; the GeForce patterns end at the
# name's end, so a Ti, a D or a Laptop GPU (other chips or clocks) gets no figure rather than a wrong one.
PEAK_BF16_TFLOPS: list[tuple[str, float, str]] = [
    (r"GeForce RTX 3090$", 71.0, "NVIDIA Ampere GA102 GPU architecture whitepaper, RTX 3090"),
    (r"GeForce RTX 4090$", 165.2, "NVIDIA Ada GPU architecture whitepaper, RTX 4090"),
    (r"GeForce RTX 5090$", 209.5, "NVIDIA RTX Blackwell GPU architecture whitepaper, RTX 5090"),
    (r"\bL4\b", 121.0, "NVIDIA L4 Tensor Core GPU datasheet (242 with sparsity)"),
    (r"\bL40S\b", 362.05, "NVIDIA L40S datasheet (733 with sparsity)"),
    (r"\bA10\b", 125.0, "NVIDIA A10 Tensor Core GPU datasheet (250 with sparsity)"),
    (r"\bA100\b", 312.0, "NVIDIA A100 Tensor Core GPU datasheet, SXM and PCIe alike (624 with sparsity)"),
    (r"\bH100\b.*\bPCIe\b", 756.0, "NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe (1,513 with sparsity)"),
    (r"\bH100\b.*\bNVL\b", 835.5, "NVIDIA H100 Tensor Core GPU datasheet, H100 NVL (1,671 with sparsity)"),
    (r"\bH100\b", 989.0, "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM (1,979 with sparsity)"),
    (r"\bH200\b.*\bNVL\b", 835.5, "NVIDIA H200 Tensor Core GPU datasheet, H200 NVL (1,671 with sparsity)"),
    (r"\bH200\b", 989.0, "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM (1,979 with sparsity)"),
    (r"\bB200\b", 2250.0, "NVIDIA HGX B200 datasheet, per GPU (36 PFLOPS with sparsity for eight)"),
    (r"\bMI300X\b", 1307.4, "AMD Instinct MI300X data sheet (2,614.9 with sparsity)"),
]


def flops_per_token(cfg: GPTConfig, non_embedding_params: int, seq_len: int) -> float:
    """Training FLOPs per token: 6N + 12 L d T."""
    return 6.0 * non_embedding_params + 12.0 * cfg.n_layer * cfg.n_embd * seq_len


def peak_tflops(device_name: str | None) -> float | None:
    """The datasheet dense bf16 peak for a device name, or None when we have no sourced figure."""
    if not device_name:
        return None
    for pattern, tflops, _datasheet in PEAK_BF16_TFLOPS:
        if re.search(pattern, device_name.strip()):
            return tflops
    return None


def mfu_pct(tokens_per_sec: float, flops_tok: float, peak: float | None) -> float | None:
    if peak is None:
        return None
    return 100.0 * tokens_per_sec * flops_tok / (peak * 1e12)
