"""benchlab/search/landscapes.py: the scripted machines' families, each as its docstring says: interactions of
about 4% on about 30% of the pairs, a large model's profile with a basin of three changes, 1% noise."""

import itertools
import statistics

import pytest

from benchlab.search.landscapes import BATCH, FAMILIES, RECIPE, RULES, Machine, family
from benchlab.search.moves import Candidate, space

BASIN = {"fp8": "all", "optimizer": "adamw_8bit", "compile_mode": "max-autotune"}


def test_the_separable_machine_multiplies_speeds_adds_memory_and_rewards_its_one_pair() -> None:
    m = family("separable")
    assert m.figures({}) == (100_000.0, 10_000.0)
    assert m.figures({"loss": "onepass"}) == pytest.approx((106_000.0, 8_500.0))
    assert m.figures({"attention": "manual", "loss": "inline"}) == pytest.approx((100_000 * 0.70 * 0.99, 13_000.0))
    apart = m.figures({"loss": "onepass"})[0] * m.figures({"compile_mode": "reduce-overhead"})[0] / 100_000
    assert m.figures({"loss": "onepass", "compile_mode": "reduce-overhead"})[0] == pytest.approx(apart * 1.02)
    assert m.figures({"activation_checkpointing": "full", "grad_accum": 8, "loss": "chunked"})[1] == 1_500.0  # floor
    assert family("separable", 3) == m


def test_interactions_touch_about_30_percent_of_pairs_by_at_most_4_percent_and_follow_the_seed() -> None:
    m = family("interactions", 0)
    pairs = [g for g in m.together if len(g) == 2 and g != frozenset({("loss", "onepass"),
                                                                      ("compile_mode", "reduce-overhead")})]
    knobs_of = [{k for k, _ in g} for g in pairs]
    assert all(len(k) == 2 for k in knobs_of)  # two different knobs each
    terms = [(k, v) for k, values in space(BATCH).items() for v in values if getattr(RECIPE, k) != v]
    possible = sum(1 for a, b in itertools.combinations(terms, 2) if a[0] != b[0])
    assert possible > 300 and 0.25 < len(pairs) / possible < 0.35
    assert all(0.96 <= m.together[g] <= 1.04 for g in pairs)
    assert family("interactions", 0) == m and family("interactions", 1) != m
    a, b = sorted(pairs[0], key=str)
    alone = m.figures(dict([a]))[0] * m.figures(dict([b]))[0] / m.start_tps
    assert m.figures(dict([a, b]))[0] == pytest.approx(alone * m.together[pairs[0]])


def test_the_large_profile_pays_for_fp8_and_its_basin_needs_all_three_changes() -> None:
    m = family("large", 0)
    assert m.figures({"fp8": "blocks"})[0] > 1.05 * m.start_tps
    assert m.figures({"activation_checkpointing": "selective"})[0] < 0.85 * m.start_tps  # alone below lean's floor
    assert m.start_mb - m.figures({"optimizer": "adamw_8bit"})[1] >= 9_000  # the optimizer's state is large
    for knob, value in BASIN.items():
        assert m.figures({knob: value})[0] < m.start_tps  # each worse alone
    for pair in itertools.combinations(BASIN.items(), 2):
        assert m.figures(dict(pair))[0] < m.figures(BASIN)[0]
    assert m.figures(BASIN)[0] > 1.05 * m.start_tps  # and good together
    assert RULES(Candidate().plus(*BASIN.items()).settings(RECIPE)) is None  # which the rules allow


def test_noise_is_one_percent_on_the_speed_the_same_for_the_same_draw() -> None:
    m, exact = family("noisy", 0), family("separable")
    changes = {"loss": "onepass"}
    draws = [m.measured(changes, str(i))[0] / exact.figures(changes)[0] - 1 for i in range(400)]
    assert 0.008 < statistics.stdev(draws) < 0.012 and abs(statistics.fmean(draws)) < 0.002
    assert m.measured(changes, "a") == m.measured(changes, "a") != m.measured(changes, "b")
    assert m.measured(changes, "a")[1] == exact.figures(changes)[1]  # memory is measured exactly
    assert exact.measured(changes, "a") == exact.figures(changes)


def test_the_machine_records_its_noise_as_the_run_s_spread() -> None:
    cand = Candidate((("loss", "onepass"),))
    assert Machine(family("noisy", 1)).screen(cand, cand.settings(RECIPE)).extra["tps_spread"] == 0.01
    assert "tps_spread" not in Machine().screen(cand, cand.settings(RECIPE)).extra


def test_an_unknown_family_is_refused_with_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="family='huge' is not valid; expected " + ", ".join(FAMILIES)):
        family("huge")
