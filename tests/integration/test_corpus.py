"""Streaming prepare in a child process over corpora of two sizes: its peak memory stays flat as the corpus grows. The
corpus's other tests are in tests/unit/test_corpus.py."""

from pathlib import Path

import pytest

from tests.unit.test_corpus import child, generated_corpus


@pytest.mark.integration
def test_memory_stays_flat_as_the_corpus_grows(tmp_path: Path) -> None:
    peaks = {}
    for size in (3_000_000, 15_000_000):
        proc = child(generated_corpus(tmp_path / f"{size}.txt", size), tmp_path / f"out{size}")
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        peaks[size] = int(stdout.split()[-1])
        assert "prepare encode:" in stderr and "MB/s" in stderr and "s left" in stderr  # the progress line
    # Five times the text, the same memory (MiB): the whole-file code needed ~200 bytes a corpus byte (3 GB here).
    assert peaks[15_000_000] < peaks[3_000_000] + 40, peaks
    assert peaks[15_000_000] < 1024, peaks  # torch and pyarrow imported alone take ~600 MiB in some venvs
