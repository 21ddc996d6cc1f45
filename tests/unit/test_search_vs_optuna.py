"""scripts/search_vs_optuna.py: the brute-force fronts of the scripted machines, our search's score on each family,
and the Optuna study it is compared with."""

import importlib.util
import sys
from pathlib import Path

import pytest

from benchlab.search.landscapes import FAMILIES, RECIPE, RULES, family
from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "search_vs_optuna.py"
FASTEST = "weight_dtype=bf16+loss=onepass+fp8=blocks+optimizer=adamw_bf16_sr+compile_mode=reduce-overhead"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("search_vs_optuna", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["search_vs_optuna"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    del sys.modules["search_vs_optuna"]


def test_the_brute_force_front_is_the_scripted_machine_s(script) -> None:
    scored = script.Scored(family("separable"))
    front = scored.front
    n_allowed = len(script.allowed())
    assert 0 < n_allowed < 4 * 2 * 2 * 3 * 6 * 4 * 5 * 2 * 2 * 4 * 4
    assert all(RULES(c.settings(RECIPE)) is None for c in script.allowed()[:: 997])  # each one allowed
    assert len(front) == 7 and front[max(front)] == FASTEST  # every change that speeds it up, the pair included
    every = {scored.point(dict(c.changes)) for c in script.allowed()}
    for tps, mem in front:  # unbeaten, at the floor or above
        assert tps >= scored.floor and not any(t >= tps and m <= mem and (t, m) != (tps, mem) for t, m in every)
    for t, m in every - set(front):  # any other point at the floor or above is beaten by one of them
        if t >= scored.floor:
            assert any(tps >= t and mem <= m for tps, mem in front)
    assert scored.share(list(front)) == 1.0 and scored.share([scored.point({})]) == 0.0


@pytest.mark.parametrize("name", FAMILIES)
def test_our_search_holds_90_percent_of_the_front_after_50_runs_on_each_family(script, tmp_path: Path,
                                                                                name: str) -> None:
    scored = script.Scored(family(name, 0))
    trace = script.ours(scored, 50, tmp_path)
    assert len(trace.points) == 50 and trace.points[0] == scored.point({})
    assert scored.share(trace.points) >= 0.90, f"{scored.landscape.name}: {scored.share(trace.points):.1%}"


def test_on_the_separable_machine_our_search_finds_the_whole_front_and_goes_on_to_its_cap(script,
                                                                                       tmp_path: Path) -> None:
    scored = script.Scored(family("separable"))
    trace = script.ours(scored, 80, tmp_path)
    assert trace.runs_to_cover(set(scored.front)) == 49 and len(trace.points) == 80  # never stops with runs left
    assert len(set(trace.points)) > 70  # few configurations share a point: it measures new ones


def test_the_optuna_study_counts_runs_and_resumes_from_its_journal(script, tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    scored = script.Scored(family("noisy", 0))
    storage = tmp_path / "study.log"
    first = script.optuna_study(scored, 0, 12, storage)
    assert len(first.points) == 12
    assert first.points[0] == scored.point({})  # the recipe, enqueued first; scored on its true figures
    again = script.optuna_study(scored, 0, 12, storage)
    assert again.points == first.points  # nothing measured again
    more = script.optuna_study(scored, 0, 15, storage)
    assert more.points[:12] == first.points and len(more.points) == 15


def test_the_comparison_reports_each_family_s_means(script, tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    lines: list[str] = []
    out = script.compare(["separable", "large"], 1, 1, 20, tmp_path, lines.append)
    assert list(out["families"]) == ["separable", "large"] and len(lines) == 2
    large = out["families"]["large"]
    assert large["landscapes"][0]["landscape"] == "large-0" and len(large["landscapes"][0]["tpe"]) == 1
    assert large["ours_share_at_max"] == large["landscapes"][0]["ours"]["share_at_max"]
    assert 0 < large["tpe_share_at_max"] <= 1 and large["landscapes"][0]["ours"]["runs"] == 20
