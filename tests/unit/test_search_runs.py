"""benchlab/search/runs.py's resume key, `context`: what a journal's runs are valid for.

A search resumes the runs of a journal line whose context equals its own, so the context must change with
everything a run's figures depend on (the model, the batch, the steps, the memory cap, the machine, torch and
the code) and with nothing else: not between two runs of the same search. Tested through what it gives back,
and through the journal that compares it, not through how it is built.
"""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from benchlab.core.params import Params, parse_params
from benchlab.search import runs, worker
from benchlab.search.journal import Entry, Journal
from tests.conftest import ROOT, micro_params

CPU = torch.device("cpu")
MACHINE = {"cpu": "AMD EPYC 7B13", "gpu": None, "torch": "2.13.0+cpu"}


@pytest.fixture()
def machine(monkeypatch: pytest.MonkeyPatch) -> dict:
    """The environment and source hash `context` reads, set by the test instead of measured."""
    facts = {**MACHINE, "source_sha256": "a" * 64}
    monkeypatch.setattr(runs, "environment", lambda: {k: v for k, v in facts.items() if k != "source_sha256"})
    monkeypatch.setattr(runs, "source_sha256", lambda *args: facts["source_sha256"])
    return facts


def context_of(p: Params, device: torch.device = CPU) -> dict:
    return runs.context(p, device)


def with_start(p: Params, **knobs: object) -> Params:
    """The params with the search's start variant changed."""
    start = p.search.start
    return replace(p, variants={**p.variants, start: replace(p.variants[start], **knobs)})


def test_the_same_search_gets_the_same_context_and_resumes_its_runs(machine: dict, tmp_path: Path) -> None:
    p = parse_params(micro_params())
    first = context_of(p)
    assert context_of(parse_params(micro_params())) == first
    journal = Journal(tmp_path / "journal.jsonl", first)
    journal.add(Entry(name="recipe", changes={}, phase="warm", status="ok", tokens_per_sec=1000.0))
    again = Journal(tmp_path / "journal.jsonl", context_of(parse_params(micro_params())))
    assert again.get("warm", "recipe") is not None and again.get("warm", "recipe").tokens_per_sec == 1000.0


CHANGES = {
    "model": lambda p: replace(p, model="gpt_small"),
    "shape.batch_size": lambda p: replace(p, shape=replace(p.shape, batch_size=p.shape.batch_size * 2)),
    "the start's own batch": lambda p: with_start(p, batch_size=p.shape.batch_size * 2),
    "shape.block_size": lambda p: replace(p, shape=replace(p.shape, block_size=p.shape.block_size // 2)),
    "bench.steps": lambda p: replace(p, bench=replace(p.bench, steps=p.bench.steps + 1)),
    "harness.warmup_steps": lambda p: replace(p, harness=replace(p.harness, warmup_steps=p.harness.warmup_steps + 1)),
    "search.screen_steps": lambda p: replace(p, search=replace(p.search, screen_steps=p.search.screen_steps + 1)),
    "harness.memory_cap_gib": lambda p: replace(p, harness=replace(p.harness, memory_cap_gib=24.0)),
    "the start's knobs": lambda p: with_start(p, attention="manual" if p.variants[p.search.start].attention != "manual"
                                              else "sdpa"),
    "parity.steps": lambda p: replace(p, parity=replace(p.parity, steps=p.parity.steps + 1)),
}


@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
def test_a_change_to_what_a_run_measures_starts_a_new_context(machine: dict, change) -> None:
    p = parse_params(micro_params())
    assert context_of(change(p)) != context_of(p)


@pytest.mark.parametrize(("key", "value"), [("torch", "2.14.0+cpu"), ("cpu", "Intel Xeon 8480"),
                                            ("gpu", "NVIDIA H200"), ("source_sha256", "b" * 64)],
                         ids=["torch", "cpu", "gpu", "code"])
def test_another_machine_torch_or_code_starts_a_new_context(machine: dict, key: str, value: str) -> None:
    p = parse_params(micro_params())
    before = context_of(p)
    machine[key] = value
    assert context_of(p) != before


def test_a_journal_keeps_another_context_s_runs_apart(machine: dict, tmp_path: Path) -> None:
    p = parse_params(micro_params())
    journal = Journal(tmp_path / "journal.jsonl", context_of(p))
    journal.add(Entry(name="recipe", changes={}, phase="warm", status="ok", tokens_per_sec=1000.0))
    machine["torch"] = "2.14.0+cpu"
    other = Journal(tmp_path / "journal.jsonl", context_of(p))
    assert other.get("warm", "recipe") is None and len(other.others) == 1


def test_a_change_the_runs_do_not_depend_on_keeps_the_context(machine: dict) -> None:
    """The budget and the candidate count bound how many runs a search makes, not what each measured."""
    p = parse_params(micro_params())
    more = replace(p, search=replace(p.search, budget_s=p.search.budget_s * 2, max_candidates=p.search.max_candidates + 5))
    assert context_of(more) == context_of(p)


def test_answers_from_another_model_size_on_this_machine_warm_start_a_search(machine: dict, tmp_path: Path) -> None:
    """The journal reads the model, the device, torch and the cap out of each context it holds."""
    small, large = parse_params(micro_params()), parse_params(micro_params(model="gpt_small"))
    path = tmp_path / "journal.jsonl"
    Journal(path, context_of(small)).add(Entry(name="found", changes={"compile": True}, phase="found", status="ok"))
    assert Journal(path, context_of(large)).found_elsewhere() == [("found (tiny)", {"compile": True})]
    assert Journal(path, context_of(small)).found_elsewhere() == []  # its own size: resumed, not a warm start
    for key, value in [("torch", "2.14.0+cpu"), ("cpu", "Intel Xeon 8480")]:
        machine[key] = value
        assert Journal(path, context_of(large)).found_elsewhere() == [], key
        machine[key] = MACHINE[key]
    capped = replace(large, harness=replace(large.harness, memory_cap_gib=24.0))
    assert Journal(path, context_of(capped)).found_elsewhere() == []


QUIET_IMPORT = """
import sys
from benchlab.search import worker
worker.libraries_to_log(sys.argv[1])
import torchao  # noqa: F401  on a machine without its CUDA kernels: "Failed to load ... .so", and torch's warning
import logging
logging.getLogger("torch.utils._pytree").warning("a torch warning")
print("search: the search's own line")
"""


def test_a_search_prints_only_its_own_lines_and_the_libraries_messages_go_to_the_log(tmp_path: Path) -> None:
    """Issue 53: torchao's `Failed to load ... .so` lines and a torch warning were printed on every search run."""
    log = tmp_path / "search.log"
    proc = subprocess.run([sys.executable, "-c", QUIET_IMPORT, str(log)], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "search: the search's own line\n" and proc.stderr == ""
    assert "torch.utils._pytree WARNING: a torch warning" in log.read_text()
    assert os.environ.get(worker.LOG_ENV) is None  # set in the search's process (and so its children) only
