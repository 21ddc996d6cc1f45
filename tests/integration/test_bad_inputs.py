"""Bad inputs that reach a stage run in a child process, under the C or another locale (issues 46 and 53); the
battery of bad inputs is in tests/unit/test_bad_inputs.py."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.mark.integration  # a stage in a child process, under another locale
def test_a_stage_reads_params_yaml_as_utf8_under_an_ascii_locale(workdir: Path) -> None:
    """Issue 46: under LC_ALL=C PYTHONUTF8=0, params.yaml with a non-ASCII comment was a UnicodeDecodeError."""
    text = (workdir / "params.yaml").read_text(encoding="utf-8")
    (workdir / "params.yaml").write_text("# caf\u00e9, na\u00efve: UTF-8 in a comment\n" + text, encoding="utf-8")
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONPATH": str(ROOT),
           "BENCHLAB_LOCK_DIR": str(workdir)}
    env.pop("PYTHONIOENCODING", None)
    proc = subprocess.run([sys.executable, "-m", "stages.prepare", "prep"], cwd=workdir, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (workdir / "prep" / "meta.json").is_file()


@pytest.mark.integration  # stages in child processes, under the C locale
def test_non_ascii_paths_work_under_the_c_locale(workdir: Path) -> None:
    """Issue 53: under LC_ALL=C PYTHONUTF8=0, data.corpus 'données.txt' was a UnicodeEncodeError traceback (Python
    encodes file names as ASCII there); a non-ASCII output folder failed in the lock's name and the tokenizer's save."""
    shutil.copy(workdir / "corpus.txt", workdir / "donn\u00e9es.txt")
    text = (workdir / "params.yaml").read_text(encoding="utf-8").replace("corpus: corpus.txt", "corpus: donn\u00e9es.txt")
    (workdir / "params.yaml").write_text(text, encoding="utf-8")
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONPATH": str(ROOT),
           "BENCHLAB_LOCK_DIR": str(workdir)}
    env.pop("PYTHONIOENCODING", None)
    for stage, *args in (["check_corpus", "out.json"], ["env", "env.json"], ["prepare", "pr\u00e9p"]):
        proc = subprocess.run([sys.executable, "-m", f"stages.{stage}", *args], cwd=workdir, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (stage, proc.stderr[-2000:])
    meta = json.loads((workdir / "pr\u00e9p" / "meta.json").read_text())
    assert meta["corpus"] == "donn\u00e9es.txt" and meta["train_tokens"] > 0
