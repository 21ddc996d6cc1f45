"""The knob table's rows (benchlab/core/knob_row.py, knobs.py): each knob's doc, default, steps, group and search
marks, numbered by apply's order."""

from dataclasses import MISSING, fields

import pytest

from benchlab.core.knob_row import STEPS, applied_at, knob
from benchlab.core.knobs import (
    KNOBS,
    RunSettings,
    knobs_in_group,
    searched,
    unoptimized,
)
from benchlab.core.params import parse_params
from tests.conftest import micro_params

# --- the knob table's rows --------------------------------------------------------------------------------------

def test_every_knob_carries_its_doc_where_it_is_applied_and_its_default() -> None:
    for f in fields(RunSettings):
        assert isinstance(f.metadata["doc"], str) and f.metadata["doc"], f.name
        assert applied_at(f), f.name
        assert "skip" in f.metadata and f.default is not MISSING, f.name
    assert RunSettings().precision == "fp32" and RunSettings().ddp_bucket_mb == 25
    assert applied_at(fields(RunSettings)[0]) == "2. matmul flags; 8. autocast and GradScaler"


def test_a_knobs_steps_are_numbered_by_their_place_in_apply_s_order() -> None:
    # tests/unit/test_apply_knobs.py holds apply to STEPS; here, the table's numbers come from STEPS alone.
    by_name = {f.name: f for f in fields(RunSettings)}
    assert applied_at(by_name["attention"]).startswith(f"{STEPS.index('constructor')}. ") and STEPS[0] == "constructor"
    assert applied_at(by_name["loss"]) == f"{STEPS.index('loss_head')}. the loss head"
    assert applied_at(by_name["optimizer"]).startswith(f"{STEPS.index('optimizer')}. the optimizer")
    assert applied_at(by_name["batch_size"]) == "the batch stream"  # outside apply: no number
    for f in fields(RunSettings):
        applied = f.metadata["applied"]
        assert isinstance(applied, str) or set(applied) <= set(STEPS), f.name


def test_each_knob_declares_its_group_whether_it_is_searched_and_its_unoptimized_value() -> None:
    # scaling.PARALLEL_KNOBS is the parallel group; the search reads `searched` and `unoptimized`.
    assert knobs_in_group("parallel") == ("parallel", "nproc", "ddp_bucket_mb", "ddp_grad_as_bucket_view",
                                          "ddp_comm_hook", "fsdp_reshard_after_forward", "fsdp_param_dtype",
                                          "fsdp_blocks_per_unit", "nccl_max_ctas")
    assert knobs_in_group("batch") == ("batch_size", "grad_accum")
    assert all(not searched(k) for k in knobs_in_group("parallel")) and searched("loss") and searched("grad_accum")
    assert unoptimized("precision") == "fp32" and unoptimized("fused_clip") is False
    assert unoptimized("grad_accum") is None  # no value is slower by itself: the search moves it by its goal
    with pytest.raises(ValueError, match="knob group 'speed'; the groups: precision, "):
        knob(1, "a doc", "somewhere", group="speed")  # type: ignore[arg-type]


def test_every_knob_is_one_documented_row_usable_at_the_top_level_and_in_a_variant() -> None:
    data = micro_params(activation_checkpointing="full", loss="chunked", grad_accum=2)
    data["variants"]["mine"] = {"activation_checkpointing": "selective", "batch_size": 8, "grad_accum": 4}
    p = parse_params(data)
    assert p.run.activation_checkpointing == "full" and p.run.loss == "chunked" and p.run.grad_accum == 2
    assert p.variants["mine"].activation_checkpointing == "selective" and p.batch_size(p.variants["mine"]) == 8
    assert "batch_size" in KNOBS and "compile_mode" in KNOBS and "optimizer" in KNOBS
