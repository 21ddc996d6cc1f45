"""The trained model on disk: saved with the checksum of its weights, refused when damaged, named by evaluate.

The damaged, NaN and too-short-context cases, each with its message, are in tests/test_bad_inputs.py.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchlab.checkpoint import load_checkpoint, save_checkpoint
from benchlab.entry import run_main
from model.gpt import GPT, GPTConfig
from stages import evaluate, train
from tests.conftest import ROOT

TRAIN_ARGS = ["prep", "models/model.pt", "metrics/train.json", "metrics/records/train.json", "plots/train.csv"]


def test_a_checkpoint_loads_back_with_its_preset_and_checksum(tmp_path: Path) -> None:
    model = GPT(GPTConfig.from_name("tiny", vocab_size=512))
    sha256 = save_checkpoint(model, "tiny", tmp_path / "model.pt")
    loaded, which = load_checkpoint(tmp_path / "model.pt", data_vocab=512)
    assert which == {"model": "tiny", "checkpoint_sha256": sha256} and len(sha256) == 64
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]  # no temporary file left


def test_evaluate_records_which_model_it_measured(workdir: Path, prepared: Path) -> None:
    shutil.copytree(prepared, workdir / "prep")
    sha256 = save_checkpoint(GPT(GPTConfig.from_name("tiny", vocab_size=512)), "tiny", workdir / "models" / "model.pt")
    run_main(evaluate.main, ["prep", "models/model.pt", "metrics/eval.json"])
    record = json.loads((workdir / "metrics" / "eval.json").read_text())
    assert record["model"] == "tiny" and record["checkpoint_sha256"] == sha256
    assert record["val_loss"] > 0 and record["eval_tokens"] == 2 * 4 * 32


def test_a_validation_loss_that_is_not_finite_is_never_recorded(workdir: Path, prepared: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Training ends with finite losses, but the last update broke the weights: no result, no checkpoint."""
    shutil.copytree(prepared, workdir / "prep")
    monkeypatch.setattr("benchlab.runner.evaluate", lambda *args, **kwargs: float("nan"))
    with pytest.raises(SystemExit) as stop:
        run_main(train.main, TRAIN_ARGS)
    assert stop.value.code == 2
    assert "training stopped: loss became nan at step 12" in capsys.readouterr().err
    assert not any(Path(p).exists() for p in TRAIN_ARGS[1:])


# A stage in a child process whose files may grow to LIMIT bytes; SIGXFSZ ignored, so a write past it fails
# with EFBIG (what a full disk does with ENOSPC) instead of killing the process.
LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), int(sys.argv[1])))
from benchlab.entry import run_main
from stages import {stage}
run_main({stage}.main, sys.argv[2:])
"""


def run_limited(stage: str, limit: int, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-c", LIMITED.format(stage=stage), str(limit), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_full_disk_while_saving_the_checkpoint_is_one_line_and_leaves_nothing(workdir: Path, prepared: Path) -> None:
    shutil.copytree(prepared, workdir / "prep")
    proc = run_limited("train", 100_000, TRAIN_ARGS, workdir)  # the tiny model's checkpoint is ~450 kB
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: writing models/model.pt failed: the write stopped short") and "Traceback" not in proc.stderr
    assert "ulimit -f" in last and "nothing was recorded" in last
    assert not any(Path(p).exists() for p in TRAIN_ARGS[1:])
    assert not list((workdir / "models").glob(".model.pt.tmp-*"))
