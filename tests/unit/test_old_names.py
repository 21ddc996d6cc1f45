"""The knobs that `optimizer` replaced (benchlab/core/old_names.py): refused naming what to write, and committed
runs' old knobs read as the optimizer that trains the same."""

from dataclasses import asdict

import pytest
import yaml

from benchlab.core.errors import LabError
from benchlab.core.old_names import from_old_knobs
from benchlab.core.params import parse_params
from tests.conftest import micro_params
from tests.knob_cases import refused

# --- the knobs that `optimizer` replaced ------------------------------------------------------------------------

@pytest.mark.parametrize("knob, value, write", [
    ("fused_adamw", True, "optimizer: adamw_fused"),
    ("fused_adamw", False, "nothing (optimizer: adamw is the default)"),
    ("adam_state", "8bit", "optimizer: adamw_8bit"),
    ("compile_update", True, "optimizer: adamw_compiled"),
    ("weight_dtype", "bf16_sr", "weight_dtype: bf16 with optimizer: adamw_bf16_sr"),
])
def test_an_old_optimizer_knob_is_refused_naming_what_to_write(knob: str, value: object, write: str) -> None:
    replaced = "the optimizer knob replaced fused_adamw, adam_state, compile_update and weight_dtype=bf16_sr"
    refused(f"{knob}={value!r} is not valid: {replaced}; write {write}", **{knob: value})
    data = micro_params()
    data["variants"]["old"] = {knob: value}
    with pytest.raises(LabError) as err:
        parse_params(data)
    assert str(err.value) == f"variants.old.{knob}={value!r} is not valid: {replaced}; write {write}"


@pytest.mark.parametrize("old, new", [
    ({"fused_adamw": True, "adam_state": "fp32", "compile_update": False, "weight_dtype": "fp32"},
     {"optimizer": "adamw_fused", "weight_dtype": "fp32"}),
    ({"fused_adamw": False, "adam_state": "fp32", "compile_update": False, "weight_dtype": "bf16"},
     {"optimizer": "adamw", "weight_dtype": "bf16"}),
    ({"fused_adamw": False, "adam_state": "8bit", "compile_update": False}, {"optimizer": "adamw_8bit"}),
    ({"fused_adamw": False, "compile_update": True, "compile": True}, {"optimizer": "adamw_compiled", "compile": True}),
    ({"weight_dtype": "bf16_sr", "precision": "bf16"},
     {"optimizer": "adamw_bf16_sr", "weight_dtype": "bf16", "precision": "bf16"}),
    ({"precision": "bf16"}, {"precision": "bf16"}),  # none of them: as it is
])
def test_a_committed_runs_old_knobs_read_as_the_optimizer_that_trains_the_same(old: dict, new: dict) -> None:
    assert from_old_knobs(old) == new


# params.yaml's variants before the `optimizer` knob, as committed at 5ab632e.
OLD_VARIANTS = """
fp32_baseline: {attention: manual, compile: false, fused_adamw: false, precision: fp32}
recipe: {attention: sdpa, compile: true, fused_adamw: true, precision: bf16}
fastest: {attention: sdpa, compile: true, compile_mode: reduce-overhead, loss: onepass, precision: bf16, weight_dtype: bf16_sr}
lean: {activation_checkpointing: full, attention: sdpa, compile: true, loss: chunked, precision: bf16, weight_dtype: bf16_sr}
tf32: {precision: tf32}
sdpa: {attention: sdpa}
fp16: {precision: fp16}
bf16: {precision: bf16}
fused_adamw: {fused_adamw: true}
compile: {compile: true}
ckpt_full: {activation_checkpointing: full, attention: sdpa, compile: true, fused_adamw: true, precision: bf16}
ckpt_selective: {activation_checkpointing: selective, attention: sdpa, compile: true, fused_adamw: true, precision: bf16}
loss_chunked: {attention: sdpa, compile: true, fused_adamw: true, loss: chunked, precision: bf16}
loss_inline: {attention: sdpa, compile: true, fused_adamw: true, loss: inline, precision: bf16}
loss_fused: {attention: sdpa, compile: true, fused_adamw: true, loss: fused, precision: bf16}
loss_cce: {attention: sdpa, compile: true, fused_adamw: true, loss: cce, precision: bf16}
loss_onepass: {attention: sdpa, compile: true, fused_adamw: true, loss: onepass, precision: bf16}
clip_fused: {attention: sdpa, compile: true, fused_adamw: true, fused_clip: true, precision: bf16}
weights_bf16: {attention: sdpa, compile: true, fused_adamw: true, precision: bf16, weight_dtype: bf16}
weights_bf16_sr: {attention: sdpa, compile: true, precision: bf16, weight_dtype: bf16_sr}
cuda_graphs: {attention: sdpa, compile: true, compile_mode: reduce-overhead, fused_adamw: true, precision: bf16}
update_compiled: {attention: sdpa, compile: true, compile_update: true, precision: bf16}
update_graphed: {attention: sdpa, compile: true, compile_mode: reduce-overhead, compile_update: true, precision: bf16}
fp8: {attention: sdpa, compile: true, fp8: blocks, fused_adamw: true, precision: bf16}
fp8_head: {attention: sdpa, compile: true, fp8: head, fused_adamw: true, precision: bf16}
adam_8bit: {adam_state: 8bit, attention: sdpa, compile: true, precision: bf16}
accum_4: {attention: sdpa, batch_size: 16, compile: true, fused_adamw: true, grad_accum: 4, precision: bf16}
batch_4: {attention: sdpa, batch_size: 4, compile: true, fused_adamw: true, precision: bf16}
batch_64: {attention: sdpa, batch_size: 64, compile: true, fused_adamw: true, precision: bf16}
ddp_2: {attention: manual, batch_size: 16, compile: false, fused_adamw: false, nproc: 2, parallel: ddp, precision: fp32}
fsdp2_2: {attention: manual, batch_size: 16, compile: false, fused_adamw: false, nproc: 2, parallel: fsdp2, precision: fp32}
"""


def test_the_variants_before_the_optimizer_knob_mean_what_params_yaml_says_now() -> None:
    old = {n: from_old_knobs(v) for n, v in yaml.safe_load(OLD_VARIANTS).items()}
    data = micro_params()
    now = parse_params(data).variants
    old_params = parse_params({**data, "variants": old})
    assert {n: asdict(s) for n, s in old_params.variants.items()} == {n: asdict(s) for n, s in now.items()}


def test_a_record_holds_a_moved_param_under_its_new_key_then_its_old_one() -> None:
    from benchlab.core.old_names import record_keys

    assert record_keys("shape.batch_size") == ("params.shape.batch_size", "params.train.batch_size")
    assert record_keys("harness.memory_cap_gib") == ("params.harness.memory_cap_gib", "params.bench.memory_cap_gib")
    assert record_keys("bench.steps") == ("params.bench.steps",)  # never moved
