"""scripts/search_vs_optuna.py: its brute-force front of the scripted machine, and its Optuna study (skipped
without optuna, which is not one of the lab's requirements)."""

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.test_search import FASTEST, RECIPE, RULES, figures

SCRIPT = ROOT / "scripts" / "search_vs_optuna.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("search_vs_optuna", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["search_vs_optuna"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    del sys.modules["search_vs_optuna"]


def test_the_front_of_a_few_points_keeps_the_unbeaten_at_or_above_the_floor(script) -> None:
    points = {(100.0, 50.0), (120.0, 80.0), (90.0, 40.0), (95.0, 60.0), (120.0, 81.0), (99.0, 50.0), (80.0, 1.0)}
    assert script.front_of(points, 85.0) == {(100.0, 50.0), (120.0, 80.0), (90.0, 40.0)}
    assert script.front_of(points, 0.0) == {(100.0, 50.0), (120.0, 80.0), (90.0, 40.0), (80.0, 1.0)}
    assert script.front_of({(100.0, 50.0), (100.0, 50.0), (100.0, 60.0)}, 0.0) == {(100.0, 50.0)}


def test_the_brute_force_front_is_the_scripted_machine_s(script) -> None:
    front, n_allowed = script.known_front()
    assert n_allowed == len(script.allowed()) and 0 < n_allowed < 4 * 2 * 2 * 3 * 6 * 4 * 5 * 2 * 2 * 4 * 4
    assert all(RULES(c.settings(RECIPE)) is None for c in script.allowed()[:: 997])  # each one allowed
    # the fastest allowed configuration: every change that speeds the machine up, the pair's bonus included
    assert max(front) == script.point({"weight_dtype": "bf16", "loss": "onepass", "fp8": "blocks",
                                       "optimizer": "adamw_bf16_sr", "compile_mode": "reduce-overhead"})
    assert front[max(front)] == FASTEST
    # no allowed configuration beats a front point on both figures, and every point is at lean's floor or above
    every = {script.point(dict(c.changes)) for c in script.allowed()}
    for tps, mem in front:
        assert tps >= 0.85 * figures({})[0]
        assert not any(t >= tps and m <= mem and (t, m) != (tps, mem) for t, m in every)
    # and any other point at the floor or above is beaten by one of them
    for t, m in every - set(front):
        if t >= 0.85 * figures({})[0]:
            assert any(tps >= t and mem <= m for tps, mem in front)


def test_our_search_on_the_machine_finds_the_whole_front(script, tmp_path: Path) -> None:
    front, _ = script.known_front()
    trace = script.ours(200, tmp_path)
    assert trace.points[0] == script.point({}) and max(front) in trace.points
    assert trace.coverage(set(front), len(trace.points)) == len(front) == 7
    assert trace.runs_to_cover(set(front)) == len(trace.points)  # its last run found the front's last point
    assert trace.hypervolume(len(trace.points)) == script.hypervolume(set(front))
    assert script.ours(40, tmp_path / "short").coverage(set(front), 40) < len(front)  # the goals' paths alone do not


def test_the_optuna_study_counts_runs_and_resumes_from_its_journal(script, tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    storage = tmp_path / "study.log"
    first = script.optuna_study("nsga2", 0, 12, storage)
    assert len(first.points) == 12
    assert first.points[0] == script.point({})  # the recipe, enqueued first
    again = script.optuna_study("nsga2", 0, 12, storage)
    assert again.points == first.points  # nothing measured again
    more = script.optuna_study("nsga2", 0, 15, storage)
    assert more.points[:12] == first.points and len(more.points) == 15
