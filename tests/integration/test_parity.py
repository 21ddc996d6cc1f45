"""Parity by training: the batch order it controls, a reference against itself, a variant with a wrong learning rate,
a skipped run left unjudged, and the stage in a child process writing what aggregate reads. The verdict and the bad
params are in tests/unit/test_parity.py."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from benchlab.run import parity
from benchlab.run.runner import train_once
from tests.conftest import ROOT
from tests.unit.test_parity import parity_params

CPU = torch.device("cpu")


@pytest.mark.integration
def test_the_batch_order_follows_data_seed_and_the_weights_follow_seed(tokens) -> None:
    p = parity_params()
    ref = p.variants[p.parity.reference]
    a = train_once(p, ref, tokens, CPU, 6, 1, data_seed=1)
    again = train_once(p, ref, tokens, CPU, 6, 1, data_seed=1)
    other = train_once(p, ref, tokens, CPU, 6, 1, data_seed=2)
    assert a.losses == again.losses
    assert a.losses[0] != other.losses[0]  # other batches from the first step
    reseeded = train_once(dataclasses.replace(p, seed=p.seed + 1), ref, tokens, CPU, 6, 1, data_seed=1)
    assert reseeded.losses[0] != a.losses[0]  # same batches, other initial weights


def reference_of(p, tokens) -> dict:
    runs = [parity.train_curve(p, p.parity.reference, tokens, CPU, s) for s in p.parity.seeds]
    return parity.reference_record(p, runs, parity.data_passes(p, p.parity.reference, tokens))


@pytest.mark.integration
def test_the_reference_against_itself_learns_the_same(tokens) -> None:
    p = parity_params(parity__tolerance=1.0)
    ref = reference_of(p, tokens)
    assert ref["status"] == "ok" and ref["noise_nats"] > 0  # two orders: some spread
    same = parity.train_curve(p, p.parity.reference, tokens, CPU, p.parity.seeds[0])
    rec = parity.variant_record(p, "tf32", same, ref, 0.5)
    assert rec["gap_nats"] == 0.0 and rec["learns_same"] is True and rec["verdict"] == "same"
    assert rec["tail_loss"] == pytest.approx(sum(same.losses[-4:]) / 4)


@pytest.mark.integration
def test_a_variant_with_a_wrong_learning_rate_fails_parity(tokens) -> None:
    p = parity_params(parity__tolerance=0.05)
    ref = {**reference_of(p, tokens), "noise_nats": 0.0}  # judge the gap alone
    wrong = dataclasses.replace(p, optim=dataclasses.replace(p.optim, lr=p.optim.lr / 50, min_lr=0.0))
    run = parity.train_curve(wrong, "sdpa", tokens, CPU, p.parity.seeds[0])  # eager: no compile in the suite
    rec = parity.variant_record(p, "sdpa", run, ref, 0.5)
    assert rec["learns_same"] is False and rec["verdict"].startswith("worse by"), rec["verdict"]
    assert rec["gap_nats"] > 0.05


@pytest.mark.integration
def test_a_skipped_variant_or_reference_is_not_judged(tokens) -> None:
    p = parity_params()
    skipped = parity.train_curve(p, "fastest", tokens, CPU, 1)  # CUDA graphs: not on a CPU
    assert skipped.status == "skipped"
    rec = parity.variant_record(p, "fastest", skipped, {"status": "ok"}, 1.0)
    assert rec["learns_same"] is None and rec["verdict"].startswith("not judged: fastest skipped: compile_mode=")
    run = parity.train_curve(p, "sdpa", tokens, CPU, 1)
    rec = parity.variant_record(p, "sdpa", run, {"status": "oom", "message": "out of memory"}, 1.0)
    assert rec["learns_same"] is None and rec["verdict"] == "not judged: the reference tf32 oom: out of memory"


@pytest.mark.integration
def test_the_stage_writes_what_aggregate_reads(workdir: Path) -> None:
    data = yaml.safe_load((workdir / "params.yaml").read_text())
    data["parity"].update(steps=8, tail_steps=3, tolerance=5.0, variants=["sdpa"])
    (workdir / "params.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = lambda *args, stage: subprocess.run([sys.executable, "-m", *args], cwd=workdir, capture_output=True,  # noqa: E731
                                              text=True, env={**env, "DVC_STAGE": stage})
    assert run("stages.prepare", "prep", stage="prepare").returncode == 0
    early = run("stages.parity", "prep", "rec", "curves", stage="parity@sdpa")
    assert early.returncode != 0 and "rec/reference-seeds.json is missing or unreadable" in early.stderr, early.stderr
    assert "Traceback" not in early.stderr
    ref = run("stages.parity", "prep", "rec", "curves", stage="parity_reference")
    assert ref.returncode == 0 and "parity@tf32: ok, orders" in ref.stdout, ref.stderr
    out = run("stages.parity", "prep", "rec", "curves", stage="parity@sdpa")
    assert out.returncode == 0 and "parity@sdpa: same" in out.stdout, out.stdout + out.stderr
    record = json.loads((workdir / "rec/sdpa.json").read_text())
    assert record["learns_same"] is True and record["reference"] == "tf32" and record["steps"] == 8
    assert record["env.torch"] == torch.__version__ and "provenance.source_sha256" in record
    lines = (workdir / "curves/sdpa.csv").read_text().splitlines()
    assert lines[0] == "step,loss,reference_loss" and len(lines) == 9
    seeds = (workdir / "curves/reference-seeds.csv").read_text().splitlines()
    assert seeds[0] == "step,seed_a,seed_b" and len(seeds) == 9
    wrong = run("stages.parity", "prep", "rec", "curves", stage="parity@lean")
    assert wrong.returncode != 0 and "variant 'lean' is not in parity.variants; valid: sdpa" in wrong.stderr
