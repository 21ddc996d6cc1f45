"""The loss heads as the rules see them: each choice of the `loss` knob with what it needs and what it does to the
output layer, declared once, and the rule that follows from it (`check_loss_head`). Torch-free: the knob table
(`benchlab.core.knobs`), the device checks (`benchlab.core.skips.loss_skip`) and the head builder
(`benchlab.run.heads.choose`) all read it; the heads' code is in `benchlab/run/heads/`.
"""

from dataclasses import dataclass
from typing import Literal, get_args

from benchlab.core.errors import check

LossKind = Literal["standard", "inline", "chunked", "fused", "cce", "onepass"]


@dataclass(frozen=True)
class LossHead:
    """One loss head: its part of the `loss` knob's doc and the facts the rules, the skips and the builder read."""

    doc: str
    # Multiplies the hidden states by the output weight itself instead of calling the model's `lm_head`: a float8
    # output layer (fp8=head or all) would be bypassed, and under FSDP2 with compile it cannot run as
    # `BodyThenHead` (the model's own output layer compiled apart from the body).
    owns_output_matmul: bool
    # False: it reads the output weight outside FSDP2's sharded module (fused, onepass), refused with parallel=fsdp2.
    fsdp2_safe: bool = True
    # The pip package of its CUDA kernel (None: torch's ops), and the `DeviceFacts` field that says it is installed
    # (where `pinned`, the field `<installed>_version` holds the installed release).
    library: str | None = None
    installed: str = ""
    # The library release whose internal kernel it calls by keyword (arguments change between releases): on CUDA it
    # is skipped under any other release (requirements-gpu.txt pins the same one, tests/unit/test_requirements.py).
    pinned: str | None = None
    runs_on_cpu: bool = True  # False: a Triton kernel only, skipped on a CPU
    instead: str = "chunked"  # the head its skip proposes


LOSS_HEADS: dict[str, LossHead] = {
    "standard": LossHead("logits then cross-entropy, as the public recipe (logits returned)", owns_output_matmul=False),
    "inline": LossHead("the same logits and cross-entropy, but only the loss leaves the compiled region",
                       owns_output_matmul=False),
    "chunked": LossHead("after the compiled body, the output layer and cross-entropy over chunks of tokens, each "
                        "chunk's gradients made in forward so only one chunk's logits live", owns_output_matmul=True),
    "fused": LossHead("liger-kernel's fused linear + cross-entropy, after the compiled body", owns_output_matmul=True,
                      fsdp2_safe=False, library="liger-kernel", installed="liger", runs_on_cpu=False),
    "cce": LossHead("cut-cross-entropy's kernel there instead (logits never stored, no gradient filtering)",
                    owns_output_matmul=True, library="cut-cross-entropy", installed="cce", runs_on_cpu=False),
    # onepass's op has a torch path on a CPU; on CUDA it calls liger-kernel's internal cross-entropy kernel.
    "onepass": LossHead("inside the compiled graph, one op makes the logits, then liger-kernel's cross-entropy kernel "
                        "writes the loss and the logits' gradient in one pass over them and the gradient products "
                        "follow in forward (on CPU the same arithmetic in torch)", owns_output_matmul=True,
                        fsdp2_safe=False, library="liger-kernel", installed="liger", pinned="0.8.5",
                        instead="inline"),
}

if tuple(LOSS_HEADS) != get_args(LossKind):  # a bug in this module, found on import
    raise ValueError(f"LOSS_HEADS {tuple(LOSS_HEADS)} and LossKind {get_args(LossKind)} must name the same heads")


def heads_where(wanted: bool, fact: str) -> tuple[str, ...]:
    """The heads whose boolean field `fact` is `wanted`, in the catalog's order."""
    return tuple(name for name, head in LOSS_HEADS.items() if getattr(head, fact) == wanted)


def loss_doc() -> str:
    """The `loss` knob's doc: each head's, in the catalog's order."""
    return "; ".join(f"{name}: {head.doc}" for name, head in LOSS_HEADS.items())


def check_loss_head(where: str, loss: str, fp8: str, parallel: str) -> None:
    """What the loss head does to the output layer, on every device: a head that multiplies by the output weight
    itself bypasses a float8 output layer, and one that reads it outside the sharded module cannot run under fsdp2.
    `where` prefixes the key ("variants.x."); a refusal names it and the heads that would do."""
    head = LOSS_HEADS[loss]
    own, other = heads_where(True, "owns_output_matmul"), heads_where(False, "owns_output_matmul")
    check(fp8 not in ("head", "all") or not head.owns_output_matmul, f"{where}loss", loss,
          f"{_listed(other, 'or')} with fp8={fp8} (the {_listed(own, 'and')} heads multiply by the output weight "
          "themselves, so the float8 output layer would be bypassed; or set fp8=blocks)")
    check(parallel != "fsdp2" or head.fsdp2_safe, f"{where}loss", loss,
          f"{_listed(heads_where(True, 'fsdp2_safe'), 'or')} with parallel=fsdp2 (the {loss} head reads the output "
          "weight outside the sharded module)")


def _listed(names: tuple[str, ...], last: str) -> str:
    """"a, b or c" (`last` "or"), "a, b and c" (`last` "and")."""
    return f"{', '.join(names[:-1])} {last} {names[-1]}" if len(names) > 1 else names[0]
