"""Knobs that change the math (benchlab/core/knobs.py's `changes_math`): marked in the knob table, refused by parity
in one line, never tried by the search, and marked in the summary's track column."""

import pytest

from benchlab.analysis.summary import track
from benchlab.core.errors import LabError
from benchlab.core.knobs import RunSettings, changes_math, check_combination, math_changes
from benchlab.core.params import parse_params
from benchlab.search.moves import Candidate, choices, moves
from tests.conftest import ROOT, micro_params


def test_the_knob_table_says_which_values_change_the_math() -> None:
    assert changes_math("optimizer", "muon") and not changes_math("optimizer", "adamw_fused")
    assert changes_math("schedule", "wsd") and not changes_math("schedule", "cosine")
    assert changes_math("cooldown_fraction", 0.5) and not changes_math("precision", "bf16")
    assert math_changes(RunSettings(optimizer="muon", schedule="wsd", precision="bf16")) == [
        "optimizer=muon", "schedule=wsd"]
    readme = (ROOT / "README.md").read_text()
    assert "| `schedule` | `cosine` \\| `wsd` | `cosine` | **changes the math** (time-to-loss track, not parity): " in readme
    assert "| `adamw` | **optimizer=muon changes the math** (time-to-loss track, not parity): AdamW" in readme


def test_parity_refuses_a_math_changing_knob_in_one_line() -> None:
    data = micro_params()
    data["variants"]["muon_recipe"] = {**data["variants"]["recipe"], "optimizer": "muon"}
    data["parity"]["variants"] = ["recipe", "muon_recipe"]
    with pytest.raises(LabError) as err:
        parse_params(data)
    assert str(err.value) == (
        "parity.variants='muon_recipe' is not valid; expected a variant of the same math: muon_recipe sets "
        "optimizer=muon, which changes the optimization, so parity (does it learn what the reference learns, step "
        "for step) cannot judge it; put it in ttl.variants (time to a target loss)")
    data = micro_params()
    data["variants"]["wsd_ref"] = {"schedule": "wsd"}
    data["parity"].update(reference="wsd_ref", variants=["recipe"])
    with pytest.raises(LabError, match=r"^parity\.reference='wsd_ref' is not valid; expected a variant of the same "
                                       r"math: wsd_ref sets schedule=wsd, "):
        parse_params(data)


def test_the_math_knobs_own_rules_are_refused_naming_the_key() -> None:
    for settings, message in [
        (RunSettings(optimizer="muon", precision="fp16"), "precision='fp16' is not valid; expected fp32, tf32 or bf16 "
         "with optimizer=muon"),
        (RunSettings(optimizer="muon", parallel="fsdp2", nproc=2), "parallel='fsdp2' is not valid; expected none or "
         "ddp with optimizer=muon"),
        (RunSettings(cooldown_fraction=0.5), "schedule='cosine' is not valid; expected wsd when cooldown_fraction is set"),
        (RunSettings(schedule="wsd", cooldown_fraction=0.0), "cooldown_fraction=0.0 is not valid; expected a fraction"),
    ]:
        with pytest.raises(LabError, match="^" + message.replace("(", r"\(")):
            check_combination("", settings, 16)


def test_the_search_never_tries_a_value_that_changes_the_math() -> None:
    assert "muon" not in choices("optimizer") and "adamw_fused" in choices("optimizer")
    names = [c.name for c in moves(Candidate(), RunSettings(), "fastest", 16) + moves(Candidate(), RunSettings(), "lean", 16)]
    assert names and not [n for n in names if "muon" in n or "schedule" in n or "cooldown" in n]


def test_the_summary_marks_each_row_with_its_track() -> None:
    assert track({"optimizer": "adamw_fused", "precision": "bf16"}) == "systems-only"
    assert track({"optimizer": "muon", "schedule": "wsd"}) == "changes the optimization: optimizer=muon, schedule=wsd"
    assert track({"optimizer": "adamw", "schedule": None}) == "systems-only"  # a record from before the knob
