"""The search's and the time-to-loss track's stages list exactly the params they read: each runs in its own process,
as DVC runs it, noting its reads (tests/unit/test_dvc_params.py holds the comparison; tests/integration/test_pipeline.py
does the same for dvc.yaml)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.unit.test_dvc_params import check_reads


@pytest.mark.integration  # the search and the time-to-loss stages, each in its own process as DVC runs them: minutes
def test_the_search_and_ttl_stages_list_exactly_what_they_read(workdir: Path) -> None:
    data = yaml.safe_load((workdir / "params.yaml").read_text())
    data["parity"].update(steps=4, tail_steps=2, tolerance=5.0)
    data["aggregate"]["ours"] = ["sdpa"]  # a warm start that runs on a CPU without compiling
    data["search"] = {"start": "fp32_baseline", "budget_s": 600, "screen_steps": 2, "max_candidates": 2, "confirm": 1,
                      "repeats": 1, "lean_floor": 0.5}
    data["python_corpus"]["bytes"] = 20_000
    # The first evaluation before the budget on every seed, however loaded the machine: a reference without a target
    # leaves ttl@muon nothing to train, and so nothing to read (CI at ea5843f: evaluations at steps 3 and 6, budget
    # 0.75 of the mean time, and one seed's step 3 came after it). Each warm-up step counts as the median step m, so
    # the first evaluation is at 2m and the budget at least 0.9 x (2m + 3m) / 2 = 2.25m (run/ttl.py, training_clock).
    data["ttl"].update(reference="fp32_baseline", steps=8, eval_every=2, warmup_steps=2, budget_fraction=0.9, seeds=[1, 2],
                       sweep_lrs=[0.002], sweep_warmup_steps=[1], variants={"muon": {"optimizer": "muon"}})
    (workdir / "params.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    reads = workdir / "param-reads"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BENCHLAB_PARAM_READS": str(reads), "BENCHLAB_LOCK_DIR": str(workdir)}

    def run(stage: str, module: str, *args: str) -> None:
        proc = subprocess.run([sys.executable, "-m", module, *args], cwd=workdir, capture_output=True, text=True,
                              env={**env, "DVC_STAGE": stage}, timeout=600)
        assert proc.returncode == 0, f"{stage}: {proc.stderr[-2000:]}"

    run("prepare", "stages.prepare", "prep")
    run("parity_reference", "stages.parity", "prep", "rec", "curves")
    run("search", "stages.search", "prep", "rec/reference-seeds.json", "out", "search.json")
    run("python_corpus", "stages.python_corpus", "gen/python_sources.jsonl", "python_corpus.json")
    run("ttl_reference", "stages.ttl", "prep", "ttl", "ttl_curves")
    ref = json.loads((workdir / "ttl" / "reference-sweep.json").read_text())
    assert ref["status"] == "ok", f"the reference set no target, so ttl@muon would train nothing: {ref['message']}"
    run("ttl@muon", "stages.ttl", "prep", "ttl", "ttl_curves")
    run("ttl_report", "stages.ttl_report", "ttl", "ttl_report.md", "ttl_loss.png", "ttl.json")
    check_reads(reads, "search/dvc.yaml", only={"search"})
    check_reads(reads, "ttl/dvc.yaml", only={"python_corpus", "ttl_reference", "ttl", "ttl_report"})
