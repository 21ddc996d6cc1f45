"""The search's screening worker (benchlab/search/runs.py) in its own process: it screens candidates in turn, a refused
one does not end it, and one that dies fails its candidate and the next starts a new worker."""

from pathlib import Path

import pytest
import yaml

from benchlab.search import worker as search_worker
from tests.conftest import ROOT, micro_params


@pytest.fixture()
def worker_lab(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    params = micro_params(data__corpus="corpus.txt", search__start="fp32_baseline", search__screen_steps=3)
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    return workdir


@pytest.mark.integration
def test_one_worker_screens_candidates_in_turn_and_a_refused_one_does_not_end_it(worker_lab: Path,
                                                                                 prepared: Path) -> None:
    worker = search_worker.Worker(str(prepared))
    try:
        first = worker.screen({})
        pid = worker.proc.pid if worker.proc else None
        second = worker.screen({"attention": "sdpa"})
        refused = worker.screen({"precision": "fp16"})  # no loss scaling on a CPU: the rules refuse it there
        last = worker.screen({"optimizer": "adamw_fused"})
        assert worker.proc is not None and worker.proc.pid == pid  # one process did all four
    finally:
        worker.close()
    assert worker.proc is None
    assert (first.status, second.status, last.status) == ("ok", "ok", "ok"), (first.message, second.message)
    assert len(first.timed_ms) == len(second.timed_ms) == 3 and first.warmup_steps == 2  # harness.warmup_steps
    assert first.startup_s is not None and first.startup_s > 0  # the worker's start, paid once
    assert second.startup_s is None and last.startup_s is None
    assert refused.status == "error" and "precision=fp16" in refused.message


@pytest.mark.integration
def test_a_worker_that_dies_fails_its_candidate_and_the_next_starts_a_new_one(worker_lab: Path,
                                                                              prepared: Path) -> None:
    worker = search_worker.Worker(str(prepared))
    try:
        worker.screen({})
        assert worker.proc is not None and worker.proc.stdin is not None
        worker.proc.stdin.close()  # the worker reads its end of input and exits: a reply never comes
        worker.proc.stdin = open("/dev/null", "w")  # noqa: SIM115 - the next request goes nowhere
        dead = worker.screen({"attention": "sdpa"})
        again = worker.screen({"attention": "sdpa"})
    finally:
        worker.close()
    assert dead.status == "error" and dead.message == "the screening worker died (exit 0) on this candidate"
    assert again.status == "ok" and again.startup_s is not None  # a new worker, paying its own start
