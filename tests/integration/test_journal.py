"""The search stage, run as DVC runs it in child processes, refuses a forged journal line naming the journal (issue 53).
The journal's own checks are in tests/unit/test_journal.py."""

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from benchlab.search.journal import Entry
from tests.conftest import ROOT


@pytest.mark.integration
def test_the_search_stage_refuses_a_forged_journal_naming_it(workdir: Path) -> None:
    """Issue 53: a forged line stopped every rerun with an error naming a temporary candidate.json."""
    data = yaml.safe_load((workdir / "params.yaml").read_text())
    data["parity"].update(steps=4, tail_steps=2, tolerance=5.0)
    data["search"].update(start="fp32_baseline", budget_s=60)
    (workdir / "params.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BENCHLAB_LOCK_DIR": str(workdir)}
    run = lambda *args, stage="": subprocess.run([sys.executable, "-m", *args], cwd=workdir, capture_output=True,  # noqa: E731
                                                 text=True, env={**env, "DVC_STAGE": stage}, timeout=600)
    assert run("stages.prepare", "prep", stage="prepare").returncode == 0
    assert run("stages.parity", "prep", "rec", "curves", stage="parity_reference").returncode == 0
    context = subprocess.run([sys.executable, "-c", CONTEXT_OF], cwd=workdir, capture_output=True, text=True,
                             env=env, check=True).stdout
    forged = {"fused_clip": True}  # refused with optimizer=adamw: the clipping scale needs fused AdamW
    (workdir / "out").mkdir()
    (workdir / "out" / "journal.jsonl").write_text(
        json.dumps({"context": json.loads(context), **asdict(Entry("fused_clip=true", forged, "warm", "ok",
                                                                  tokens_per_sec=1e6, peak_mem_mb=1.0))}) + "\n")
    proc = run("stages.search", "prep", "rec/reference-seeds.json", "out", "search.json")
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert last.startswith("error: out/journal.jsonl, line 1: fused_clip=true is a combination the knob rules refuse")
    assert "candidate.json" not in proc.stderr and not (workdir / "search.json").exists()


# The context the search stage computes for these params on this machine, printed as JSON.
CONTEXT_OF = """
import json
from benchlab.core.params import load_params
from benchlab.run.hardware import resolve_device
from benchlab.search import runs
p = load_params()
print(json.dumps(runs.context(p, resolve_device(p.device))))
"""
