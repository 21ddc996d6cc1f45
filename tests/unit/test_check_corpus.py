"""The check_corpus stage: a corpus that DVC would hang on is refused before DVC reads it, whichever stage is named.

Issue 46: `dvc repro prepare` (or `train`, `evaluate`) with a FIFO or a link to /dev/zero in the corpus folder
hung, or spun a core, because DVC hashed the corpus for prepare before the env stage's refusal could run.
"""

import json
import os
from pathlib import Path

import pytest

from benchlab.core.stage_main import run_main
from stages import check_corpus
from tests.conftest import ROOT

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


def test_the_readme_names_the_one_command_that_still_hangs_on_a_special_file() -> None:
    """Issue 53: `dvc status` hashes data.corpus itself, before any stage of ours can refuse a FIFO or a link to
    /dev/zero in it; the README says so where it lists the refusal."""
    readme = (ROOT / "README.md").read_text()
    line = next(i for i, text in enumerate(readme.splitlines()) if "FIFO, socket or broken link is refused" in text)
    said = " ".join(readme.splitlines()[line:line + 2])
    assert "`dvc status`" in said and "hangs" in said and "before any stage" in said, said
