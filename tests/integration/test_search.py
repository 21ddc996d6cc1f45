"""The search stage for real on a CPU, its processes spawned (the screening worker, fresh-process repeats, parity): every
output, and a rerun that repeats nothing. The search itself, on scripted machines, is in tests/unit/test_search.py."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from benchlab.search import report
from tests.conftest import ROOT


@pytest.mark.integration
def test_the_stage_searches_records_and_resumes(workdir: Path) -> None:
    """The real stage on a CPU (processes spawned: the screening worker, fresh-process repeats, parity): every
    output, and a rerun that repeats nothing."""
    data = yaml.safe_load((workdir / "params.yaml").read_text())
    data["parity"].update(steps=8, tail_steps=2, tolerance=5.0)
    data["aggregate"]["ours"] = ["sdpa"]  # a warm start that runs on a CPU without compiling
    data["search"] = {"start": "fp32_baseline", "budget_s": 600, "screen_steps": 2, "max_candidates": 3, "confirm": 1,
                      "repeats": 1, "lean_floor": 0.5}
    (workdir / "params.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    # A lock of this test's own: the start's screening run, which sizes the budget, is timed from before it takes the
    # device lock, and the other xdist worker's stages would otherwise hold the machine-wide one meanwhile.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BENCHLAB_LOCK_DIR": str(workdir)}
    run = lambda *args, stage="": subprocess.run([sys.executable, "-m", *args], cwd=workdir, capture_output=True,  # noqa: E731
                                                 text=True, env={**env, "DVC_STAGE": stage})
    assert run("stages.prepare", "prep", stage="prepare").returncode == 0
    early = run("stages.search", "prep", "rec/reference-seeds.json", "out", "search.json")
    assert early.returncode != 0 and "rec/reference-seeds.json is missing or unreadable" in early.stderr
    assert run("stages.parity", "prep", "rec", "curves", stage="parity_reference").returncode == 0
    first = run("stages.search", "prep", "rec/reference-seeds.json", "out", "search.json")
    assert first.returncode == 0, first.stderr
    said = first.stdout.splitlines()
    plan = next(i for i, line in enumerate(said) if line.startswith("search: budget 600 s: the start's screening run "))
    assert said[0] == "search: warm #1: start" and plan < said.index("search: warm #2: attention=sdpa")
    # the start, the warm start, then the first fastest move in the knob table's order around the faster of the
    # two (on a CPU sdpa and the math attention are within noise of each other); fp16 is refused on a CPU
    screened = [line.split(": ")[-1] for line in said if " #" in line]
    # (the budget keeps a run for the finalist's CUDA graphs, so a third screening run fits only on a fast machine)
    assert screened[:2] == ["start", "attention=sdpa"] and len(screened) in (2, 3), screened
    assert screened[2:] in ([], ["precision=tf32"], ["precision=tf32+attention=sdpa"]), screened
    out = workdir / "out"
    assert sorted(p.name for p in out.iterdir()) == ["candidates.csv", "found.yaml", "front.csv", "front.png",
                                                     "journal.jsonl", "report.md"]
    journal = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    phases = [e["phase"] for e in journal]
    assert phases[:3] == ["warm", "confirm", "warm"] and "parity" in phases and "found" in phases
    assert all(e["context"]["model"] == "tiny" and e["context"]["device"] for e in journal)
    rows = list(csv.DictReader((out / "candidates.csv").read_text().splitlines()))
    assert tuple(rows[0]) == report.CSV_COLUMNS and rows[0]["name"] == "start"
    assert all(float(rows[0][k]) >= 0 for k in ("startup_s", "build_s", "warmup_s", "timed_s"))
    assert any(r["name"] in ("precision=fp16", "precision=fp16+attention=sdpa") and r["status"] == "refused"
               for r in rows)  # around whichever of the two warm points was faster
    front = list(csv.DictReader((out / "front.csv").read_text().splitlines()))
    assert front and tuple(front[0]) == report.FRONT_COLUMNS
    summary = json.loads((workdir / "search.json").read_text())
    assert summary["runs"] == len(screened) and summary["start_tokens_per_sec"] > 0 and summary["front_points"] == len(front)
    assert summary["spent_s"] > 0 and summary["screening_run_s_median"] > 0
    found = yaml.safe_load((out / "found.yaml").read_text())["variants"]
    assert set(found) == {"fastest_tiny", "lean_tiny"}
    assert {r["answer"] for r in front} >= {"fastest"} or any("fastest" in r["answer"] for r in front)
    page = (out / "report.md").read_text()
    assert page.startswith("# Search on ") and "![front](front.png)" in page and "| startup |" in page
    assert (out / "front.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    before = {name: (out / name).read_bytes() for name in ("journal.jsonl", "candidates.csv", "front.csv", "found.yaml")}
    again = run("stages.search", "prep", "rec/reference-seeds.json", "out", "search.json")
    assert again.returncode == 0, again.stderr
    assert " #" not in again.stdout and "parity of" not in again.stdout and "repeated" not in again.stdout, again.stdout
    assert json.loads((workdir / "search.json").read_text()) == summary
    assert {name: (out / name).read_bytes() for name in before} == before  # nothing appended, nothing changed
