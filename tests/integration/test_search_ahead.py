"""Screening in seconds (issue 50), with a real compile on the CPU: a candidate compiled ahead on one layer is loaded
from the cache at full depth. The search's side, with stand-ins, is in tests/unit/test_search_ahead.py."""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from benchlab.core.knobs import RunSettings
from benchlab.search import worker
from tests.conftest import ROOT, micro_params

# ---- a real compile on the CPU: one layer ahead, the full depth loads it ----

DEEP = """
import sys
from benchlab.core.params import load_params
from benchlab.run.data import load_tokens
from benchlab.run.runner import train_once
from benchlab.search import worker
p = load_params()
settings = worker.read_candidate(p, open(sys.argv[2]).read(), "test")
rec = worker.counted(lambda: train_once(worker.with_candidate(p, settings), settings, load_tokens(sys.argv[1]),
                                        worker.resolve_device("cpu"), 3, 1))
print(rec.status, rec.compile_hits, rec.compile_misses)
"""


@pytest.mark.integration
def test_a_candidate_compiled_ahead_on_one_layer_is_loaded_from_the_cache_at_full_depth(
        workdir: Path, prepared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    params = micro_params(data__corpus="corpus.txt", search__start="fp32_baseline")
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(workdir / "cache"))
    settings = worker.ahead(replace(RunSettings(), compile=True), "blocks")
    assert settings is not None
    cand = workdir / "cand.json"
    cand.write_text(json.dumps({"compile": True, "compile_scope": "blocks"}))
    ahead = subprocess.run([sys.executable, "-m", "stages.search_worker", str(prepared), "--precompile", str(cand)],
                           cwd=workdir, capture_output=True, text=True, timeout=600)
    assert ahead.returncode == 0, ahead.stderr[-2000:]
    assert "compiled ahead: ok" in ahead.stdout
    deep = subprocess.run([sys.executable, "-c", DEEP, str(prepared), str(cand)], cwd=workdir, capture_output=True,
                          text=True, timeout=600)
    assert deep.returncode == 0, deep.stderr[-2000:]
    status, hits, misses = deep.stdout.split()[-3:]
    assert status == "ok" and int(hits) >= 4 and int(misses) == 0  # every graph from the cache, none compiled
