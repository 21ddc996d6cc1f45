"""The trained model on disk, written by a train stage in a child process whose files may not grow past a limit: a
full disk is one line and leaves nothing. The checkpoint's own tests are in tests/unit/test_checkpoint.py."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_faults import scratch_sources
from tests.unit.test_checkpoint import TRAIN_ARGS

# A stage in a child process whose files may grow to LIMIT bytes; SIGXFSZ ignored, so a write past it fails
# with EFBIG (what a full disk does with ENOSPC) instead of killing the process.
LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), int(sys.argv[1])))
from benchlab.core.stage_main import run_main
from stages import {stage}
run_main({stage}.main, sys.argv[2:])
"""


def run_limited(stage: str, limit: int, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """The stage run from a copy of the sources in `cwd`: its git status under the limit (provenance) could
    otherwise be killed while rewriting the checkout's index and leave .git/index.lock behind."""
    env = scratch_sources(cwd)
    return subprocess.run([sys.executable, "-c", LIMITED.format(stage=stage), str(limit), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.integration
def test_a_full_disk_while_saving_the_checkpoint_is_one_line_and_leaves_nothing(workdir: Path, prepared: Path) -> None:
    shutil.copytree(prepared, workdir / "prep")
    proc = run_limited("train", 100_000, TRAIN_ARGS, workdir)  # the tiny model's checkpoint is ~450 kB
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: writing checkpoints/model.pt failed: the write stopped short") and "Traceback" not in proc.stderr
    assert "ulimit -f" in last and "nothing was recorded" in last
    assert not any(Path(p).exists() for p in TRAIN_ARGS[1:])
    assert not list((workdir / "checkpoints").glob(".model.pt.tmp-*"))
