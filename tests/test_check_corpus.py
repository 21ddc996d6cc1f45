"""The check_corpus stage: a corpus that DVC would hang on is refused before DVC reads it, whichever stage is named.

Issue 46: `dvc repro prepare` (or `train`, `evaluate`) with a FIFO or a link to /dev/zero in the corpus folder
hung, or spun a core, because DVC hashed the corpus for prepare before the env stage's refusal could run.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

from benchlab.core.stage_main import run_main
from stages import check_corpus
from tests.conftest import ROOT, copy_sources
from tests.test_dvc_faults import lab_params, run, set_params
from tests.test_pipeline import COPY

OUT = "metrics/corpus_check.json"


def test_a_regular_corpus_passes_and_its_record_never_changes(workdir: Path) -> None:
    run_main(check_corpus.main, [OUT])
    first = (workdir / OUT).read_bytes()
    (workdir / "corpus.txt").write_text("other text\n")  # what prepare reads changes; this stage's output does not
    run_main(check_corpus.main, [OUT])
    assert (workdir / OUT).read_bytes() == first and json.loads(first) == {"corpus_special_files": 0}


def test_a_fifo_in_the_corpus_folder_is_refused_without_opening_it(workdir: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (workdir / "texts").mkdir()
    (workdir / "texts" / "a.txt").write_text("text\n")
    os.mkfifo(workdir / "texts" / "pipe.txt")
    text = (workdir / "params.yaml").read_text().replace("corpus: corpus.txt", "corpus: texts")
    (workdir / "params.yaml").write_text(text)
    (workdir / "metrics").mkdir()
    (workdir / OUT).write_text("stale")
    with pytest.raises(SystemExit) as exit_info:
        run_main(check_corpus.main, [OUT])
    assert exit_info.value.code == 2 and (workdir / OUT).read_text() == "stale"  # the earlier output stays
    assert ("error: data.corpus='texts' holds texts/pipe.txt, a FIFO (named pipe): DVC would hang reading it while "
            "hashing the corpus; remove it (rm texts/pipe.txt)") in capsys.readouterr().err


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


def test_the_readme_names_the_one_command_that_still_hangs_on_a_special_file() -> None:
    """Issue 53: `dvc status` hashes data.corpus itself, before any stage of ours can refuse a FIFO or a link to
    /dev/zero in it; the README says so where it lists the refusal."""
    readme = (ROOT / "README.md").read_text()
    line = next(i for i, text in enumerate(readme.splitlines()) if "FIFO, socket or broken link is refused" in text)
    said = " ".join(readme.splitlines()[line:line + 2])
    assert "`dvc status`" in said and "hangs" in said and "before any stage" in said, said
