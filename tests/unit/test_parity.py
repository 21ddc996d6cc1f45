"""Parity: the verdict in both directions, its records and its bad params. Parity by training is in
tests/integration/test_parity.py."""

import pytest

from benchlab.core.errors import LabError
from benchlab.core.params import parse_params
from benchlab.run import parity
from tests.conftest import micro_params


def parity_params(**overrides: object):
    return parse_params(micro_params(parity__steps=12, parity__tail_steps=4,
                                     parity__variants=["recipe", "fastest", "lean"], **overrides))


@pytest.mark.parametrize("gap, noise, tolerance, same, words", [
    (0.01, 0.005, 0.05, True, "same"),
    (-0.049, 0.0, 0.05, True, "same"),
    (0.2, 0.01, 0.05, False, "worse by 0.200 nats"),
    (-0.3, 0.01, 0.05, False, "better by 0.300 nats"),
    (0.0, 0.08, 0.05, None, "not judged: the reference's two batch orders end 0.080 nats apart"),
    # Issue 53: at the tolerance exactly, in either direction, a variant still learns the same (`<=`, not `<`), and a
    # reference whose own noise is the tolerance can still judge.
    (0.25, 0.0, 0.25, True, "same"),
    (-0.25, 0.0, 0.25, True, "same"),
    (0.0, 0.25, 0.25, True, "same"),
], ids=["within", "within, better", "worse", "better", "noisy reference", "gap at the tolerance",
        "gap at the tolerance, better", "noise at the tolerance"])
def test_verdict_against_the_tolerance_and_the_references_own_noise(gap, noise, tolerance, same, words) -> None:
    got_same, got_words = parity.verdict(gap, noise, tolerance)
    assert got_same is same and got_words.startswith(words)


def test_a_reference_made_with_other_params_is_refused() -> None:
    p = parity_params()
    ref = parity.settings_record(p)
    parity.check_reference(p, ref)
    with pytest.raises(LabError, match=r"other params \(steps\); rerun `dvc repro parity_reference`"):
        parity.check_reference(p, {**ref, "steps": 99})


def test_data_passes_counts_the_tokens_of_every_step(tokens) -> None:
    p = parity_params()
    assert parity.data_passes(p, "recipe", tokens) == pytest.approx(12 * 4 * 32 / len(tokens.train))


def test_curve_csv_leaves_a_shorter_run_blank() -> None:
    text = parity.curve_csv({"loss": [2.0, 1.5], "reference_loss": [2.0]})
    assert text == "step,loss,reference_loss\n0,2.000000,2.000000\n1,1.500000,\n"


@pytest.mark.parametrize("overrides, words", [
    ({"parity__tail_steps": 200}, "parity.tail_steps=200 is not valid; expected between 1 and parity.steps=150"),
    ({"parity__steps": 1}, "parity.steps=1 is not valid; expected 2 or more"),
    ({"parity__tolerance": 0}, "parity.tolerance=0.0 is not valid; expected a positive number of nats"),
    ({"parity__tolerance": -0.1}, "parity.tolerance=-0.1 is not valid"),
    ({"parity__seeds": [3, 3]}, "parity.seeds=[3, 3] is not valid; expected two different integers"),
    ({"parity__seeds": [1]}, "parity.seeds=[1] is not valid"),
    ({"parity__reference": "ghost"}, "parity.reference='ghost' is not valid; expected fp32_baseline"),
    ({"parity__variants": ["recipe", "nope"]}, "parity.variants='nope' is not valid"),
    ({"parity__variants": ["tf32"]}, "parity.variants=['tf32'] is not valid; expected variants other than the reference"),
    ({"parity__variants": ["ddp_2"]}, "parity.variants='ddp_2' is not valid; expected a one-process variant"),
    ({"parity__depth": 3}, "unknown key 'parity.depth'"),
])
def test_bad_parity_params_get_one_line_errors(overrides, words) -> None:
    data = micro_params()
    data["parity"].update(steps=150, tail_steps=30, variants=["recipe", "fastest", "lean"])
    for dotted, value in overrides.items():
        data["parity"][dotted.split("__")[1]] = value
    with pytest.raises(LabError) as err:
        parse_params(data)
    assert words in str(err.value) and "\n" not in str(err.value)
