"""The knob table (`benchlab.core.knobs`) owns the knobs: the copies of its list that must be written out elsewhere
(params.yaml's top-level lines and their comments, dvc.yaml's train params) are checked against it here, and a
knob the train stage cannot honour at the top level is refused there in one line naming where to set it; each
combination the knobs' rules refuse (`check_combination`) is refused when params load, naming the key and the fix.
No torch here."""


import re
from typing import Literal, get_args, get_origin, get_type_hints

import pytest
import yaml

from benchlab.core.errors import LabError
from benchlab.core.knobs import (
    IN_A_VARIANT,
    KNOBS,
    TOP_LEVEL_KNOBS,
    RunSettings,
    knobs_in_group,
)
from benchlab.core.params import parse_params
from tests.conftest import ROOT, micro_params
from tests.knob_cases import refused, with_knobs


def test_the_train_stage_honours_every_knob_at_the_top_level_but_the_batch_and_the_process_layout() -> None:
    # A run over several processes is a variant's, under torchrun; the train stage's batch is shape.batch_size.
    assert set(KNOBS) - set(TOP_LEVEL_KNOBS) == {"batch_size", *knobs_in_group("parallel")}
    assert TOP_LEVEL_KNOBS == tuple(k for k in KNOBS if k in TOP_LEVEL_KNOBS)  # in the table's order


def test_a_knob_the_train_stage_cannot_honour_is_refused_at_the_top_level_naming_where_to_set_it() -> None:
    with pytest.raises(LabError) as err:
        parse_params(micro_params(parallel="ddp", nproc=2))
    assert str(err.value) == (
        "parallel='ddp' at the top level is not valid; set it in a variant (the train stage runs in one process; a "
        "variant's bench stage runs under torchrun)")
    for name in set(KNOBS) - set(TOP_LEVEL_KNOBS) - {"batch_size"}:
        with pytest.raises(LabError) as err:
            parse_params(micro_params(**{name: getattr(RunSettings(), name)}))  # its default too: no stage reads it
        assert str(err.value).startswith(f"{name}=") and str(err.value).endswith(f"is not valid; {IN_A_VARIANT}")
    data = micro_params()
    data["variants"]["two"] = {"parallel": "ddp", "nproc": 2}  # where it belongs
    assert parse_params(data).variants["two"].nproc == 2


def test_params_yaml_has_a_top_level_line_for_each_knob_the_train_stage_honours_in_the_table_s_order() -> None:
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert [k for k in data if k in KNOBS] == list(TOP_LEVEL_KNOBS)
    assert all(data[k] == getattr(RunSettings(), k) for k in TOP_LEVEL_KNOBS)  # the train stage: the baseline's


def test_dvc_yaml_s_train_stage_lists_exactly_the_top_level_knobs() -> None:
    # `dvc exp run -S precision=bf16` reruns the train stage because it lists the key; a knob it does not list
    # would rerun nothing.
    train = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["train"]
    assert [k for k in train["params"] if k in KNOBS] == list(TOP_LEVEL_KNOBS)


def knob_comments(text: str) -> dict[str, str]:
    """The comment of each top-level knob line of params.yaml, with the comment-only lines that continue it."""
    lines, comments = text.splitlines(), {}
    for i, line in enumerate(lines):
        match = re.match(r"^(\w+):[^#]*#(.*)$", line)
        if not match or match[1] not in KNOBS:
            continue
        parts = [match[2]]
        for after in lines[i + 1:]:
            more = re.match(r"^\s+#(.*)$", after)
            if not more:
                break
            parts.append(more[1])
        comments[match[1]] = " ".join(part.strip() for part in parts)
    return comments


def listed_choices(comment: str) -> list[str]:
    """The choices a comment lists as `a (why) | b | c: what`: the first word of each part."""
    return [re.match(r"[\w-]+", part.strip())[0] for part in comment.split(" | ")]  # type: ignore[index]


def test_each_knob_s_comment_in_params_yaml_lists_exactly_its_choices() -> None:
    comments = knob_comments((ROOT / "params.yaml").read_text())
    hints = get_type_hints(RunSettings)
    assert set(comments) == set(TOP_LEVEL_KNOBS)
    for name, comment in comments.items():
        if get_origin(hints[name]) is Literal:
            assert listed_choices(comment) == list(get_args(hints[name])), name
        else:
            assert " | " not in comment, name  # a number or a flag: no list of choices to drift


def test_a_comment_missing_a_choice_is_found() -> None:
    text = "compile_mode: default # default | reduce-overhead (CUDA graphs) | max-autotune-no-cudagraphs\n"
    assert listed_choices(knob_comments(text)["compile_mode"]) == ["default", "reduce-overhead",
                                                                   "max-autotune-no-cudagraphs"]
    multi = "optimizer: adamw  # adamw (loop) |\n    # muon: changes the math\nseed: 1\n"
    assert knob_comments(multi) == {"optimizer": "adamw (loop) | muon: changes the math"}


# --- combinations refused when params load, on every device ----------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    ({"compile_mode": "reduce-overhead"}, "compile_mode='reduce-overhead' is not valid; expected default unless compile=true"),
    ({"grad_accum": 3}, "grad_accum=3 is not valid; expected a divisor of the batch size 4"),
    ({"grad_accum": 0}, "grad_accum=0 is not valid; expected 1 or more"),
    ({"activation_checkpointing": "some"}, "expected one of: none, full, selective"),
    ({"loss": "focal"}, "expected one of: standard, inline, chunked, fused, cce, onepass"),
    ({"weight_dtype": "fp16"}, "weight_dtype='fp16' is not valid; expected one of: fp32, bf16"),
    ({"optimizer": "sgd"}, "optimizer='sgd' is not valid; expected one of: adamw, adamw_fused, adamw_compiled, "
                           "adamw_8bit, adamw_bf16_sr"),
    ({"nccl_max_ctas": -1}, "nccl_max_ctas=-1 is not valid; expected 0 (NCCL's choice) or a positive count"),
    ({"fsdp_blocks_per_unit": -2}, "fsdp_blocks_per_unit=-2 is not valid; expected 0 (the whole model in the root "
                                   "unit) or a positive count of blocks"),
    ({"fsdp_blocks_per_unit": 4}, "parallel='none' is not valid; expected fsdp2 when fsdp_reshard_after_forward, "
                                  "fsdp_param_dtype or fsdp_blocks_per_unit is set"),
    ({"nccl_max_ctas": 8}, "parallel='none' is not valid; expected ddp or fsdp2 when nccl_max_ctas is set"),
    ({"loss": "chunked", "loss_chunk_tokens": 0}, "loss_chunk_tokens=0 is not valid; expected a positive count of tokens"),
    ({"loss": "onepass", "parallel": "fsdp2", "nproc": 2}, "loss='onepass' is not valid; expected standard, inline, chunked or cce "
                                                          "with parallel=fsdp2 (the onepass head reads the output "
                                                          "weight outside the sharded module)"),
    ({"loss_chunk_tokens": 1024}, "loss='standard' is not valid; expected chunked when loss_chunk_tokens is set"),
    ({"fp8": "head", "loss": "chunked"}, "loss='chunked' is not valid; expected standard or inline with fp8=head "
                                         "(the chunked, fused, cce and onepass heads multiply by the output weight themselves, "
                                         "so the float8 output layer would be bypassed; or set fp8=blocks)"),
])
def test_impossible_knob_values_are_refused_with_the_key(overrides: dict, message: str) -> None:
    with pytest.raises(LabError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        parse_params(with_knobs(**overrides))


def test_a_bad_knob_in_a_variant_names_the_variant() -> None:
    data = micro_params()
    data["variants"]["odd"] = {"batch_size": 6, "grad_accum": 4}
    with pytest.raises(LabError, match="variants.odd.grad_accum=4 is not valid; expected a divisor of the batch size 6"):
        parse_params(data)


def test_bf16_weights_need_bf16_matmuls_and_no_fsdp2() -> None:
    for precision in ("fp32", "tf32", "fp16"):
        with pytest.raises(LabError, match=f"precision='{precision}' is not valid; expected bf16 with weight_dtype=bf16"):
            parse_params(micro_params(weight_dtype="bf16", precision=precision))
    with pytest.raises(LabError, match="parallel='fsdp2' is not valid; expected none or ddp with weight_dtype=bf16"):
        parse_params(with_knobs(weight_dtype="bf16", precision="bf16", parallel="fsdp2", nproc=2))
    ddp = parse_params(with_knobs(weight_dtype="bf16", precision="bf16", parallel="ddp", nproc=2)).variants["mine"]
    assert ddp.weight_dtype == "bf16"


def test_the_compiled_update_needs_compile_and_neither_fp16_nor_fsdp2() -> None:
    refused("compile=False is not valid; expected true with optimizer=adamw_compiled, which compiles the update in "
            "compile's mode (or set optimizer=adamw)", optimizer="adamw_compiled")
    refused("precision='fp16' is not valid; expected fp32, tf32 or bf16 with optimizer=adamw_compiled (fp16's "
            "GradScaler reads its inf checks on the host, outside the compiled update; or set optimizer=adamw)",
            optimizer="adamw_compiled", compile=True, precision="fp16")
    refused("parallel='fsdp2' is not valid; expected none or ddp with optimizer=adamw_compiled (the compiled update is "
            "not wired for fsdp2's sharded gradients; or set optimizer=adamw)",
            optimizer="adamw_compiled", compile=True, parallel="fsdp2", nproc=2)
    graphed = parse_params(micro_params(optimizer="adamw_compiled", compile=True, compile_mode="reduce-overhead",
                                        precision="bf16"))
    assert graphed.run.optimizer == "adamw_compiled"
    ddp = parse_params(with_knobs(optimizer="adamw_compiled", compile=True, parallel="ddp", nproc=2)).variants["mine"]
    assert ddp.parallel == "ddp"


def test_stochastic_rounding_needs_bf16_weights() -> None:
    refused("weight_dtype='fp32' is not valid; expected bf16 with optimizer=adamw_bf16_sr (it rounds each update "
            "stochastically into bf16 weights; or set optimizer=adamw)", optimizer="adamw_bf16_sr", precision="bf16")
    sr = parse_params(micro_params(optimizer="adamw_bf16_sr", weight_dtype="bf16", precision="bf16")).run
    assert (sr.optimizer, sr.weight_dtype) == ("adamw_bf16_sr", "bf16")


def test_fused_clip_needs_the_fused_kernel_and_its_grad_scale_free() -> None:
    for optimizer in ("adamw", "adamw_8bit"):
        refused(f"fused_clip=True is not valid; expected false with optimizer={optimizer} (the clipping scale is "
                "handed to fused AdamW's kernel as its grad_scale; set optimizer=adamw_fused with it)",
                fused_clip=True, optimizer=optimizer)
    refused("precision='fp16' is not valid; expected fp32, tf32 or bf16 with fused_clip=true (fp16's GradScaler sets "
            "the fused kernel's grad_scale itself; or set fused_clip=false)",
            fused_clip=True, optimizer="adamw_fused", precision="fp16")
    refused("parallel='fsdp2' is not valid; expected none or ddp with fused_clip=true (not wired for fsdp2's sharded "
            "gradients; or set fused_clip=false)", fused_clip=True, optimizer="adamw_fused", parallel="fsdp2", nproc=2)
    clipped = parse_params(with_knobs(fused_clip=True, optimizer="adamw_fused", parallel="ddp", nproc=2)).variants["mine"]
    assert clipped.fused_clip and clipped.optimizer == "adamw_fused"


def test_a_combination_rule_in_a_variant_names_the_variant() -> None:
    data = micro_params()
    data["variants"]["graphed"] = {"optimizer": "adamw_compiled"}
    with pytest.raises(LabError, match=r"^variants\.graphed\.compile=False is not valid; expected true with "
                                       r"optimizer=adamw_compiled"):
        parse_params(data)


def test_every_committed_variant_and_preset_loads() -> None:
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    for preset in ["cpu", *data["presets"]]:
        assert parse_params({**data, "preset": preset}).variants
