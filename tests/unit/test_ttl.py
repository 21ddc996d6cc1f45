"""The time-to-loss track (benchlab/run/ttl.py, benchlab/analysis/ttl.py and ttl_arms.py, stages/ttl.py): the clock,
the target, the arms' verdicts, and the params that set them."""

import json
import time
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

import pytest
import torch
import yaml

from benchlab.analysis import ttl as judge
from benchlab.analysis.ttl_arms import tuned
from benchlab.analysis.ttl_report import report, tracks_table
from benchlab.core.errors import LabError
from benchlab.core.params import Params, parse_params
from benchlab.run import runner
from benchlab.run.ttl import run_curve, training_clock
from tests.conftest import micro_params

CPU = torch.device("cpu")


def ttl_params(**ttl: object) -> Params:
    """Micro params whose track times fp32_baseline (eager: no compilation in the test) for a few steps."""
    data = micro_params()
    data["ttl"].update({"reference": "fp32_baseline", "steps": 6, "eval_every": 2, "warmup_steps": 1,
                        "sweep_warmup_steps": [1], **ttl})
    return parse_params(data)


def curve(losses: list[float], times: list[float] | None = None) -> dict[str, Any]:
    """A finished run evaluated after steps 10, 20, ... at one second of training per evaluation unless given."""
    times = times or [float(i + 1) for i in range(len(losses))]
    return {"status": "ok", "eval_steps": [10 * (i + 1) for i in range(len(losses))], "train_s": times,
            "val_loss": losses}


def test_the_clock_counts_compilation_steps_at_the_median_step() -> None:
    assert training_clock([5000.0, 10.0, 12.0, 11.0], warmup=1) == pytest.approx([0.011, 0.021, 0.033, 0.044])
    assert training_clock([5000.0, 4000.0, 10.0, 30.0, 20.0], warmup=2) == pytest.approx(
        [0.02, 0.04, 0.05, 0.08, 0.10])


def test_the_clock_excludes_compilation_and_evaluation(tokens, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first step that takes 8 s more (compilation) and evaluations of 5 s each stay off the training clock and
    are reported apart. The seconds are added to the clock the run reads, not slept: the test takes no longer than
    its micro steps, and a loaded machine cannot blur them."""
    real_step, real_eval, real_clock, steps, late = runner.train_step, runner.evaluate, time.perf_counter, [], [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: real_clock() + late[0])

    def slow_first_step(*args: object, **kwargs: object) -> torch.Tensor:
        if not steps:
            late[0] += 8.0
        steps.append(1)
        return real_step(*args, **kwargs)

    def slow_eval(*args: object, **kwargs: object) -> float:
        late[0] += 5.0
        return real_eval(*args, **kwargs)

    monkeypatch.setattr(runner, "train_step", slow_first_step)
    monkeypatch.setattr(runner, "evaluate", slow_eval)
    p = ttl_params(steps=4, eval_every=2)
    run = run_curve(p, p.variants["fp32_baseline"], tokens, CPU, 1, None)
    assert run["status"] == "ok" and run["eval_steps"] == [2, 4]
    assert run["eval_s"] >= 2 * 5.0  # the evaluation after step 2 and the last one, apart
    # Compilation is apart: on the clock, the four steps take less than what the first took beyond the others.
    assert run["train_s"][-1] < run["warmup_excess_s"] and run["train_s"][-1] + run["warmup_excess_s"] >= 8.0
    # Steps 3 and 4 came after a 5 s evaluation: not on their clock.
    assert run["train_s"][1] - run["train_s"][0] < 5.0


def test_the_stopping_steps_are_identical_across_seeds(tokens) -> None:
    p = ttl_params(steps=5, eval_every=2)
    runs = [run_curve(replace(p, seed=s), p.variants["fp32_baseline"], tokens, CPU, s, None) for s in p.ttl.seeds]
    assert [r["eval_steps"] for r in runs] == [[2, 4, 5]] * 3  # fixed in advance, the last step included
    assert len({tuple(r["val_loss"]) for r in runs}) == 3  # the seeds differ: each is its own weights and batches
    # A run that reaches a low loss early still trains to the last step: no early stopping.
    assert all(len(r["train_s"]) == 3 for r in runs)


def test_a_variant_that_never_reaches_the_target_is_reported_as_such() -> None:
    runs = [curve([4.0, 3.6, 3.5]), curve([4.0, 3.7, 3.55]), curve([3.9, 3.6, 3.52])]
    out = judge.arm_summary(runs, target=3.4, reference_s=2.5, alpha=0.05)
    assert out["time_to_target_s_seeds"] == [None, None, None] and out["reached_seeds"] == 0
    assert out["time_to_target_s_mean"] is None and out["time_to_target"] == "not reached by 3 of 3 seeds"
    assert out["below_target"] is False and out["verdict"].startswith("not shown below the target")
    row = tracks_table([{**out, "arm": "ref", "variant": "recipe", "kind": "systems-only"},
                        {**out, "arm": "muon", "variant": "muon", "kind": "changes the optimization: optimizer=muon"}])
    assert "| not reached by 3 of 3 seeds | 0 of 3 |" in row
    # One seed short of it: still no time, never a mean over the seeds that got there.
    part = judge.arm_summary([curve([4.0, 3.3]), curve([4.0, 3.35]), curve([4.0, 3.5])], 3.4, 2.0, 0.05)
    assert part["time_to_target_s_seeds"] == [2.0, 2.0, None] and part["time_to_target_s_mean"] is None
    assert part["time_to_target"] == "not reached by 1 of 3 seeds"


def test_an_arm_below_the_target_gets_its_times_and_the_test() -> None:
    runs = [curve([3.5, 3.30, 3.20]), curve([3.5, 3.35, 3.22]), curve([3.5, 3.38, 3.21])]
    out = judge.arm_summary(runs, target=3.4, reference_s=3.0, alpha=0.05)
    assert out["time_to_target_s_seeds"] == [2.0, 2.0, 2.0] and out["time_to_target_s_mean"] == 2.0
    assert out["loss_at_budget_seeds"] == pytest.approx([3.20, 3.22, 3.21])
    assert out["below_target"] is True and out["p_value"] < 0.01 and "below the target (one-sided t-test" in out["verdict"]
    ref = judge.arm_summary(runs, 3.21, 3.0, 0.05, defines_target=True)
    assert ref["verdict"].startswith("defines the target") and ref["p_value"] is None


def test_a_target_met_at_the_first_evaluation_is_too_easy_to_time() -> None:
    """A run at the target by its first evaluation was timed to that evaluation, not to the target: no mean time."""
    runs = [curve([3.3, 3.2, 3.1]), curve([3.5, 3.35, 3.2]), curve([3.5, 3.38, 3.21])]
    out = judge.arm_summary(runs, target=3.4, reference_s=3.0, alpha=0.05)
    assert out["time_to_target_s_seeds"] == [1.0, 2.0, 2.0] and out["at_target_by_first_eval_seeds"] == 1
    assert out["time_to_target_s_mean"] is None
    assert out["time_to_target"] == ("too easy to time: 1 of 3 seeds at the target by their first evaluation "
                                     "(at most 1.0 s, maybe much less)")
    assert "| too easy to time: 1 of 3 seeds" in tracks_table([{**out, "arm": "ref", "variant": "recipe"}])
    # The test of the loss at the budget still holds: it does not depend on when the target was met.
    assert out["below_target"] is True
    # One evaluation later it is a time.
    later = judge.arm_summary(runs, target=3.25, reference_s=3.0, alpha=0.05)
    assert later["at_target_by_first_eval_seeds"] == 0 and later["time_to_target_s_mean"] == pytest.approx(8 / 3)


def test_the_report_says_when_the_reference_itself_is_at_its_target_at_once() -> None:
    runs = [curve([3.3, 3.2]), curve([3.35, 3.25])]
    ref = {**judge.arm_summary(runs, 3.4, 1.5, 0.05, defines_target=True), "arm": "reference-sweep",
           "variant": "recipe", "budget_fraction": 0.75, "reference_s": 1.5}
    text = report(ref, [], "plot.png")
    assert "at 1.5 s of training time (75% of its mean training time" in text
    assert "The target is too easy to time" in text
    fine = {**ref, **judge.arm_summary(runs, 3.22, 1.5, 0.05, defines_target=True)}
    assert "The target is too easy" not in report(fine, [], "plot.png")


def test_the_budget_is_a_share_of_the_references_own_training_time() -> None:
    """Late in the reference's run whatever the machine's speed: 75% of 20 s and of 40 s, over the ok runs."""
    runs = [curve([4.0, 3.0], times=[10.0, 20.0]), curve([4.0, 3.0], times=[20.0, 40.0]), {"status": "oom"}]
    assert judge.budget_of(runs, 0.75) == pytest.approx(22.5) and judge.budget_of(runs[:1], 0.5) == 10.0
    assert judge.budget_of([{"status": "diverged"}], 0.75) is None


def test_loss_at_the_budget_is_linear_in_training_time_and_held_after_the_end() -> None:
    run = curve([4.0, 3.0, 2.5], times=[10.0, 20.0, 30.0])
    assert judge.loss_at(run, 15.0) == pytest.approx(3.5) and judge.loss_at(run, 99.0) == 2.5
    assert judge.loss_at(run, 5.0) is None  # before the first evaluation: not measured
    assert judge.time_to(run, 3.0) == 20.0 and judge.time_to(run, 2.9) == 30.0 and judge.time_to(run, 2.0) is None
    assert judge.loss_at({"status": "diverged"}, 15.0) is None and judge.time_to({"status": "oom"}, 9.0) is None


def test_the_target_is_the_references_mean_at_its_budget_or_says_why_not() -> None:
    runs = [curve([4.0, 3.0], times=[10.0, 20.0]), curve([4.0, 3.2], times=[10.0, 20.0])]
    assert judge.target_of(runs, 15.0) == (pytest.approx(3.55), "")
    # A seed that finished before the budget has its final model there: its last loss counts, and the record says so.
    assert judge.target_of(runs, 25.0) == (pytest.approx(3.1), "2 of 2 seeds finished their 20 steps before "
                                           "the budget, 25 s (20.0 s, 20.0 s): their last loss is their loss at the budget")
    assert judge.target_of(runs, 5.0) == (None, "the reference's first evaluation came after its budget, 5 s of "
                                                "training; lower ttl.eval_every or raise ttl.budget_fraction")
    assert judge.target_of([*runs, {"status": "diverged", "message": "loss became nan"}], 15.0) == (
        None, "a reference run diverged: loss became nan")
    assert judge.best_point([{"loss_at_budget": 3.1}, {"loss_at_budget": None}, {"loss_at_budget": 3.0}]) == 2


def test_a_sweep_point_sets_the_learning_rate_its_floor_warmup_and_seed(params: Params) -> None:
    p = tuned(params, 0.008, 7, 3)
    assert (p.optim.lr, p.optim.lr_warmup_steps, p.seed) == (0.008, 7, 3)
    assert p.optim.min_lr / p.optim.lr == pytest.approx(params.optim.min_lr / params.optim.lr)


def test_ttl_variants_are_changes_to_the_reference() -> None:
    p = parse_params(micro_params())
    recipe = p.variants["recipe"]
    assert p.ttl.variants["muon"] == replace(recipe, optimizer="muon")
    assert p.ttl.variants["wsd"] == replace(recipe, schedule="wsd")
    data = micro_params()
    data["ttl"]["variants"]["bad"] = {"optimizer": "sgd"}
    with pytest.raises(LabError, match=r"^ttl\.variants\.bad\.optimizer='sgd' is not valid; expected one of: adamw"):
        parse_params(data)
    data = micro_params()
    data["ttl"]["reference"] = "nope"
    with pytest.raises(LabError, match=r"^ttl\.reference='nope' is not valid; expected one of the variants: "):
        parse_params(data)
    data = micro_params()
    data["ttl"]["seeds"] = [1]
    with pytest.raises(LabError, match=r"^ttl\.seeds=\[1\] is not valid; expected two or more different integers"):
        parse_params(data)


def test_eval_steps_are_every_eval_every_and_the_last() -> None:
    assert ttl_params(steps=7, eval_every=3).ttl.eval_steps() == [3, 6, 7]
    assert ttl_params(steps=6, eval_every=3).ttl.eval_steps() == [3, 6]


def test_the_stages_carry_the_references_budget_in_seconds_to_every_variant(
        workdir, monkeypatch: pytest.MonkeyPatch) -> None:
    """ttl_reference records reference_s, ttl.budget_fraction of its runs' mean training time, and scores its sweep
    at that share of each point's own time; ttl@<variant> judges its loss at the recorded seconds, and refuses a
    record made with another budget_fraction. The runs are stand-ins with known curves."""
    from stages import ttl as stage

    def stand_in(p: Params, settings: object, data: object, device: object, seed: int, label: object) -> dict:
        slow = 2.0 if seed == 3 else 1.0  # seed 3's machine was twice as loaded: the budget is the mean
        losses = [5.0, 4.0, 3.0, 2.0] if p.optim.lr == 0.002 else [5.0, 4.5, 4.0, 3.5]
        if getattr(settings, "optimizer") == "muon":  # fewer steps to a loss, each 1.5 times as long
            losses, slow = [4.0, 3.0, 2.0, 1.0], 1.5 * slow
        return {**curve(losses, times=[slow * t for t in (1.0, 2.0, 3.0, 4.0)]), "seed": seed, "message": "",
                "eval_s": 0.1, "warmup_excess_s": 0.0, "step_ms_median": 10.0, "tokens_per_sec": 100.0}

    monkeypatch.setattr(stage, "run_curve", stand_in)
    monkeypatch.setattr(stage, "load_tokens", lambda path: None)
    monkeypatch.setattr(stage.locks, "device_lock", lambda *args: nullcontext())
    params = micro_params(device="cpu", ttl__sweep_lrs=[0.001, 0.002], ttl__budget_fraction=0.6)
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    stage.main(["--reference", "prep", "records", "curves"])
    ref = json.loads((workdir / "records" / f"{judge.REFERENCE_NAME}.json").read_text())
    # Sweep on seed 1 (4 s each): scored at 0.6 x 4 s = 2.4 s, where lr 0.002 is at 3.6 and lr 0.001 at 4.3.
    assert [pt["loss_at_budget"] for pt in ref["sweep"]] == pytest.approx([4.3, 3.6]) and ref["lr"] == 0.002
    # Seeds 1 and 2 end at 4 s, seed 3 at 8 s: the budget is 0.6 x 16/3 s = 3.2 s, not a number from params.
    assert ref["reference_s"] == pytest.approx(3.2) and ref["budget_fraction"] == 0.6
    assert ref["target_loss"] == pytest.approx((2.8 + 2.8 + 4.4) / 3)
    stage.main(["--variant", "muon", "prep", "records", "curves"])
    muon = json.loads((workdir / "records" / "muon.json").read_text())
    # At the recorded 3.2 s, not at 0.6 of the variant's own time (4.8 s).
    assert muon["loss_at_budget_seeds"] == pytest.approx([3.0 - 0.2 / 1.5, 3.0 - 0.2 / 1.5, 4.0 - 0.2 / 3.0])
    assert muon["time_to_target_s_seeds"] == [3.0, 3.0, 6.0] and muon["at_target_by_first_eval_seeds"] == 0
    (workdir / "params.yaml").write_text(yaml.safe_dump({**params, "ttl": {**params["ttl"], "budget_fraction": 0.7}}))
    with pytest.raises(LabError, match=r"made with other params \(budget_fraction\)"):
        stage.main(["--variant", "muon", "prep", "records", "curves"])
