"""The learning rate per step (benchlab/run/schedule.py): cosine, and warmup-stable-decay with its cooldown."""

import pytest

from benchlab.core.knobs import RunSettings
from benchlab.core.sections import OptimParams
from benchlab.run.schedule import lr_at

TRAIN = OptimParams(lr=1.0, min_lr=0.1, lr_warmup_steps=2)


def test_wsd_holds_the_peak_then_decays_linearly_over_its_cooldown_to_the_floor() -> None:
    wsd = RunSettings(schedule="wsd", cooldown_fraction=0.2)
    assert [lr_at(s, 10, TRAIN, wsd) for s in range(10)] == pytest.approx(
        [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.55, 0.1])
    longer = RunSettings(schedule="wsd", cooldown_fraction=0.5)  # a non-default fraction reaches the schedule
    assert [lr_at(s, 10, TRAIN, longer) for s in range(5, 10)] == pytest.approx([0.82, 0.64, 0.46, 0.28, 0.1])


def test_cosine_is_the_default_and_differs_from_wsd_after_the_warmup() -> None:
    cosine = [lr_at(s, 10, TRAIN, RunSettings()) for s in range(10)]
    assert cosine[:2] == [0.5, 1.0] and cosine[-1] == pytest.approx(0.1) and cosine[5] < 1.0
    assert cosine != [lr_at(s, 10, TRAIN, RunSettings(schedule="wsd")) for s in range(10)]
