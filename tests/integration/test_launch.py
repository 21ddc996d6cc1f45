"""A stage's lines and its repeats' lines reach a pipe, as under DVC, in the order they were printed. How repeats and
ranks are launched is tested in tests/unit/test_launch.py."""

import os
import subprocess
import sys
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from benchlab.core.params import parse_params
from benchlab.run import launch
from benchlab.run.runner import Measurement
from tests.conftest import ROOT, micro_params


def probe_repeats(set_attr: Callable, set_env: Callable) -> None:
    """Two repeats of 0.5 s that write to the shared stdout themselves, under a deadline a third would pass. The
    repeats take their 0.5 s on a clock of the test's own, which launch reads: a real sleep on a loaded machine
    overshoots, and the line's "(0.5 s)" or the deadline's verdict would change with it."""
    clock = SimpleNamespace(now=1_000_000.0)
    clock.time = clock.perf_counter = lambda: clock.now

    def repeat(args: list[str], **kwargs: object) -> Measurement:
        os.write(1, b"child\n")
        clock.now += 0.5
        return Measurement(status="ok")

    set_attr(launch, "repeat_in_fresh_process", repeat)
    set_attr(launch, "time", clock)
    p = parse_params(micro_params(bench__repeats=3))
    set_env("BENCHLAB_DEADLINE", str(clock.now + 1.25))
    launch.run_repeats(p, "recipe", "d", ["x"])
    os.write(1, b"end\n")


@pytest.mark.integration
def test_the_stage_s_lines_reach_a_pipe_in_order_with_its_children_s(monkeypatch: pytest.MonkeyPatch,
                                                                     capfd: pytest.CaptureFixture[str]) -> None:
    # Under DVC stdout is a pipe, block-buffered: each line must be flushed before the next child writes, so the
    # pipe shows what this process printed, in the same order.
    probe_repeats(monkeypatch.setattr, monkeypatch.setenv)
    here = capfd.readouterr().out.splitlines()
    assert len(here) == 6 and here[0] == here[2] == "child" and here[5] == "end"
    for line, i in ((here[1], 1), (here[3], 2)):
        assert line.startswith("bench@recipe (variant 2 of ") and line.endswith(f" repeat {i}/3: ok (0.5 s)")
    assert here[4] == "bench@recipe: 2 of 3 repeats: another would end past BENCHLAB_DEADLINE"
    code = "import os\nfrom tests.integration.test_launch import probe_repeats\nprobe_repeats(setattr, os.environ.__setitem__)\n"
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}, "PYTHONPATH": str(ROOT)}
    piped = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env, check=True)
    assert piped.stdout.splitlines() == here
