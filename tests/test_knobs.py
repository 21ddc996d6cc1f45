"""The knob table (`benchlab.core.knobs`) owns the knobs: the copies of its list that must be written out elsewhere
(params.yaml's top-level lines and their comments, dvc.yaml's train params) are checked against it here, and a
knob the train stage cannot honour at the top level is refused there in one line naming where to set it."""

import re
from typing import Literal, get_args, get_origin, get_type_hints

import pytest
import yaml

from benchlab.core.errors import LabError
from benchlab.core.knobs import IN_A_VARIANT, KNOBS, TOP_LEVEL_KNOBS, RunSettings, knobs_in_group
from benchlab.core.params import parse_params
from tests.conftest import ROOT, micro_params


def test_the_train_stage_honours_every_knob_at_the_top_level_but_the_batch_and_the_process_layout() -> None:
    # A run over several processes is a variant's, under torchrun; the train stage's batch is train.batch_size.
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
