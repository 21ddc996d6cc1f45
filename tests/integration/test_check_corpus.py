"""The check_corpus stage under DVC (issue 46): `dvc repro` and `dvc exp run` naming a stage refuse a special file
in the corpus before DVC reads it, and the check never makes prepare rerun. The stage's own refusals are in
tests/unit/test_check_corpus.py."""

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, copy_sources
from tests.integration.test_dvc_faults import lab_params, run, set_params
from tests.integration.test_pipeline import COPY
from tests.unit.test_check_corpus import OUT


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A committed lab whose corpus is a folder; nothing reproduced yet."""
    repo = tmp_path_factory.mktemp("corpuslab")
    copy_sources(repo, COPY)
    (repo / "corpus").mkdir()
    (repo / "corpus" / "docs.txt").write_text((ROOT / "data/corpus/python_docs.txt").read_text(encoding="utf-8")[:60_000])
    params = lab_params()
    params["search"]["start"] = "fp32_baseline"  # its one variant
    set_params(repo, params)
    (repo / ".locks").mkdir()
    (repo / ".gitignore").write_text("__pycache__/\n.locks/\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "lab"]):
        run(repo, "git", *args)
    return repo


@pytest.mark.integration
@pytest.mark.parametrize("make, kind, command", [
    (os.mkfifo, "a FIFO (named pipe)", ["repro", "prepare"]),
    (os.mkfifo, "a FIFO (named pipe)", ["repro", "train"]),
    (lambda p: p.symlink_to("/dev/zero"), "a character device (a link to /dev/zero)", ["repro", "evaluate"]),
    (lambda p: p.symlink_to("/dev/zero"), "a character device (a link to /dev/zero)", ["exp", "run", "evaluate"]),
], ids=["fifo-prepare", "fifo-train", "dev-zero-evaluate", "dev-zero-exp-run-evaluate"])
def test_naming_a_stage_refuses_a_special_file_before_dvc_reads_the_corpus(lab: Path, make, kind: str,
                                                                            command: list[str]) -> None:
    special = lab / "corpus" / "extra.txt"
    make(special)
    try:
        proc = run(lab, *command, check=False)  # before the fix: hangs (a FIFO) or spins (/dev/zero) until the timeout
    finally:
        special.unlink()
        run(lab, "exp", "remove", "--all", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert f"error: data.corpus='corpus' holds corpus/extra.txt, {kind}" in out, out
    assert "Running stage 'prepare'" not in out and "Traceback" not in out


@pytest.mark.integration
def test_the_check_runs_first_and_never_makes_prepare_rerun(lab: Path) -> None:
    first = run(lab, "repro", "prepare").stdout
    assert first.index("Running stage 'check_corpus'") < first.index("Running stage 'prepare'")
    again = run(lab, "repro", "prepare").stdout
    assert "Running stage 'check_corpus'" in again and "Running stage 'prepare'" not in again, again
    status = subprocess.run(["git", "status", "--porcelain", OUT], cwd=lab, capture_output=True, text=True).stdout
    assert status.startswith("??")  # its record is a plain file, committed like metrics/env.json
