"""The bench and train stages as DVC runs them: which files each writes for the next stage, built from exactly what
was measured and the params, the line each prints, and the refusals that leave nothing behind. Measuring itself
(fresh processes, ranks, the deadline) is tests/unit/test_launch.py's; here a stand-in returns known runs, so each
field of a record can be checked against the harness's own functions."""

import json
import shutil
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import yaml

from benchlab.core.errors import LabError
from benchlab.core.params import load_params
from benchlab.run import launch
from benchlab.run.build_model import model_shape
from benchlab.run.checkpoint import load_checkpoint
from benchlab.run.hardware import why_not
from benchlab.run.mfu import flops_per_token
from benchlab.run.records import base_record, measured_record, metric_view, steps_csv
from benchlab.run.runner import Measurement
from stages import bench, train
from tests.conftest import micro_params

ENV = {"cpu": "a test CPU", "torch": "x.y"}
PROV = {"git_commit": "abc123", "date_utc": "2026-12-03T00:00:00Z"}
BENCH_ARGS = ["prep", "results", "steps"]
TRAIN_ARGS = ["prep", "checkpoints/model.pt", "metrics/train.json", "metrics/records/train.json", "plots/train.csv"]


@pytest.fixture()
def lab(workdir: Path, prepared: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, list]:
    """A workdir with prepared data, fixed environment and provenance, and the device locks each stage takes."""
    shutil.copytree(prepared, workdir / "prep")
    params = micro_params(bench__repeats=2, harness__lock="fail", harness__steady_tolerance=0.5,
                          harness__warmup_steps=3, train__steps=7)
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    locks: list = []

    @contextmanager
    def lock(device: torch.device, mode: str, holder: str):
        locks.append((device.type, mode, holder))
        yield

    for stage in (bench, train):
        monkeypatch.setattr(stage, "environment", lambda: dict(ENV))
        monkeypatch.setattr(stage, "provenance", lambda: dict(PROV))
        monkeypatch.setattr(stage.locks, "device_lock", lock)
    return {"locks": locks}


def measured_run(scale: float) -> Measurement:
    """A repeat as a child would report it: 5 steps, 2 of them warm-up."""
    return Measurement(status="ok", losses=[6.0, 5.5, 5.0, 4.75, 4.5], lrs=[1e-3, 2e-3, 2e-3, 1.5e-3, 1e-3],
                     step_ms=[900.0, 40.0 * scale, 20.0 * scale, 21.0 * scale, 22.0 * scale], warmup_steps=2,
                     setup_s=1.0, warmup_s=0.5, window_wall_ms=70.0 * scale, eval_s=0.1, val_loss=4.4 + scale,
                     memory={"peak_rss_mb": 300.0 * scale}, first_step_ms=900.0)


def read_json(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def as_written(record: dict) -> dict:
    return json.loads(json.dumps(record))


# --- bench@<variant> ---------------------------------------------------------------------------------------------

def test_bench_writes_the_record_of_its_runs_and_the_first_run_s_steps(lab: dict, monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    runs = [measured_run(1.0), measured_run(1.1)]
    calls = []

    def run_repeats(p, name, data_dir, module_args):
        calls.append((p.bench.repeats, name, data_dir, module_args))
        return runs

    monkeypatch.setattr(launch, "run_repeats", run_repeats)
    bench.main(["--variant", "sdpa", *BENCH_ARGS])
    assert calls == [(2, "sdpa", "prep", ["stages.bench", "--variant", "sdpa", *BENCH_ARGS])]
    assert lab["locks"] == [("cpu", "fail", "bench@sdpa")]

    p = load_params()
    settings = p.variants["sdpa"]
    cfg, n_params = model_shape(p, settings, 512)  # the prepared data's vocabulary
    expected = {**measured_record(base_record("sdpa", p, settings, "cpu", ENV, PROV), runs, cfg, n_params, 0.5),
                "repeats_asked": 2}
    record = read_json("results/sdpa.json")
    assert record == as_written(expected)
    assert record["flops_per_token"] == flops_per_token(cfg, n_params, 32) and record["repeats"] == 2
    assert Path("steps/sdpa.csv").read_text() == steps_csv(runs[0])
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"bench@sdpa: {record['tokens_per_sec']:.0f} tokens/s, step {record['step_ms_median']:.2f} ms, "
        f"val loss {record['val_loss']:.4f}")


def test_bench_takes_the_variant_from_dvc_stage(lab: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    names = []
    monkeypatch.setattr(launch, "run_repeats", lambda p, name, data_dir, args: names.append(name) or [measured_run(1.0)])
    monkeypatch.setenv("DVC_STAGE", "bench@tf32")
    bench.main(BENCH_ARGS)
    assert names == ["tf32"] and read_json("results/tf32.json")["variant"] == "tf32"


def test_bench_in_repeat_mode_hands_one_run_to_launch(lab: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(launch, "one_repeat", lambda *args: calls.append(args))
    monkeypatch.setattr(launch, "run_repeats", lambda *a: pytest.fail("the parent's repeats, in a repeat"))
    bench.main(["--variant", "tf32", *BENCH_ARGS, "--record-to", "rec.json"])
    assert calls == [(load_params(), "tf32", "prep", Path("rec.json"))]
    assert not Path("results").exists()  # the parent stage writes the outputs


@pytest.mark.parametrize(("stage", "texts"), [
    (bench, ["the variant to run (default: from DVC_STAGE)", "gets <variant>.json",
             "gets <variant>.csv, the per-step loss and time of the first repeat"]),
    (train, ["the numbers DVC compares (tokens/s, memory, losses)",
             "the full record: every statistic, the environment and provenance"]),
])
def test_each_stage_s_help_says_what_its_arguments_are(stage, texts: list[str], monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "300")  # one line per argument
    with pytest.raises(SystemExit):
        stage.main(["--help"])
    out = capsys.readouterr().out
    assert stage.__doc__.splitlines()[0] in out
    for text in texts:
        assert f" {text}\n" in out
    assert "--record-to" not in out  # repeat mode is the harness's, not a user's


def test_a_failed_variant_prints_no_figures(lab: dict, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(launch, "run_repeats", lambda *a: [Measurement(status="oom", message="out of memory at batch 4")])
    bench.main(["--variant", "tf32", *BENCH_ARGS])
    assert read_json("results/tf32.json")["status"] == "oom"
    assert "tokens/s" not in capsys.readouterr().out


def test_a_variant_the_device_cannot_run_is_recorded_as_skipped_with_the_reason(
        lab: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(launch, "run_repeats", lambda *a: pytest.fail("a skipped variant ran"))
    p = load_params()
    name = next(n for n, s in p.variants.items() if why_not(s, torch.device("cpu")))
    reason = why_not(p.variants[name], torch.device("cpu"))
    bench.main(["--variant", name, *BENCH_ARGS])
    assert capsys.readouterr().out.splitlines()[-1] == f"bench@{name}: skipped: {reason}"
    record = read_json(f"results/{name}.json")
    assert record == as_written({**base_record(name, p, p.variants[name], "cpu", ENV, PROV),
                                 "status": "skipped", "message": reason, "repeats": 0})
    assert Path(f"steps/{name}.csv").read_text() == "step,loss,lr,step_ms,timed\n"
    assert lab["locks"] == []  # nothing timed, so the device was not held


def test_a_bench_that_fails_keeps_the_earlier_result(lab: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    for stale in ("results/tf32.json", "steps/tf32.csv"):
        Path(stale).parent.mkdir(exist_ok=True)
        Path(stale).write_text("from an earlier run")

    def fail(*args: object) -> list:
        raise LabError("the device went away")

    monkeypatch.setattr(launch, "run_repeats", fail)
    with pytest.raises(LabError, match="the device went away"):
        bench.main(["--variant", "tf32", *BENCH_ARGS])
    assert Path("results/tf32.json").read_text() == Path("steps/tf32.csv").read_text() == "from an earlier run"


# --- train -------------------------------------------------------------------------------------------------------

def test_train_saves_the_model_and_records_what_it_measured(lab: dict, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    seen = []
    real = train.train_once

    def spy(p, settings, data, device, steps, warmup, **kwargs):
        rec = real(p, settings, data, device, steps, warmup, **kwargs)
        seen.append((settings, steps, warmup, kwargs, rec))
        return rec

    monkeypatch.setattr(train, "train_once", spy)
    train.main(TRAIN_ARGS)
    p = load_params()
    [(settings, steps, warmup, kwargs, rec)] = seen
    assert (settings, steps, warmup) == (p.run, 7, 3)
    assert kwargs == {"keep_model": True, "progress": "train"}
    assert lab["locks"] == [("cpu", "fail", "train")]

    model = rec.run.model
    expected = measured_record(base_record("train", p, p.run, "cpu", ENV, PROV, own="train"), [rec], model.cfg,
                               model.num_params(), 0.5)
    record = read_json("metrics/records/train.json")
    assert record == as_written(expected)
    assert read_json("metrics/train.json") == as_written(metric_view(expected))
    assert Path("plots/train.csv").read_text() == steps_csv(rec)
    saved, identity = load_checkpoint("checkpoints/model.pt", 512)
    assert identity["model"] == "tiny"
    for name, tensor in model.state_dict().items():
        assert torch.equal(saved.state_dict()[name], tensor), name
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"train: model=tiny {asdict(p.run)} on cpu, 7 steps"
    assert out[-1] == (
        f"train: loss {record['final_train_loss']:.4f}, val {record['val_loss']:.4f}, "
        f"{record['tokens_per_sec']:.0f} tokens/s, step {record['step_ms_median']:.1f} ms median")


@pytest.mark.parametrize(("train_steps", "warmup"), [(3, 1), (4, 2), (30, 3)])
def test_train_warms_up_for_bench_s_steps_but_leaves_two_to_time(lab: dict, monkeypatch: pytest.MonkeyPatch,
                                                                  train_steps: int, warmup: int) -> None:
    params = yaml.safe_load(Path("params.yaml").read_text())
    params["train"]["steps"] = train_steps
    Path("params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    warmups = []

    def stop(p, settings, data, device, steps, warm, **kwargs):
        warmups.append(warm)
        raise LabError("stop here")

    monkeypatch.setattr(train, "train_once", stop)
    with pytest.raises(LabError, match="stop here"):
        train.main(TRAIN_ARGS)
    assert warmups == [warmup]


def test_train_refuses_too_few_steps_to_time(lab: dict) -> None:
    params = yaml.safe_load(Path("params.yaml").read_text())
    params["train"]["steps"] = 2
    Path("params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    with pytest.raises(LabError) as err:
        train.main(TRAIN_ARGS)
    assert str(err.value) == "train.steps=2 is too few to time; use at least 3"
    assert lab["locks"] == []


def test_train_refuses_settings_the_device_cannot_run(lab: dict) -> None:
    params = yaml.safe_load(Path("params.yaml").read_text())
    params["precision"] = "fp16"
    Path("params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    with pytest.raises(LabError) as err:
        train.main(TRAIN_ARGS)
    assert str(err.value) == why_not(load_params().run, torch.device("cpu"))
    assert lab["locks"] == []  # refused by the stage before the device was taken


@pytest.mark.parametrize(("rec", "message"), [
    (Measurement(status="diverged", message="loss became nan at step 3"),
     "training stopped: loss became nan at step 3; lower optim.lr or use another precision"),
    (Measurement(status="ok", val_loss=None),
     "the trained model's validation loss is None, so nothing was recorded; lower optim.lr or use another precision"),
    (Measurement(status="ok", val_loss=float("inf")),
     "the trained model's validation loss is inf, so nothing was recorded; lower optim.lr or use another precision"),
])
def test_a_training_without_a_result_writes_nothing_and_keeps_the_earlier_outputs(lab: dict, monkeypatch: pytest.MonkeyPatch, rec: Measurement,
                                                    message: str) -> None:
    for stale in TRAIN_ARGS[1:]:
        Path(stale).parent.mkdir(parents=True, exist_ok=True)
        Path(stale).write_text("from an earlier run")
    monkeypatch.setattr(train, "train_once", lambda *a, **k: rec)
    with pytest.raises(LabError) as err:
        train.main(TRAIN_ARGS)
    assert str(err.value) == message
    assert [Path(out).read_text() for out in TRAIN_ARGS[1:]] == ["from an earlier run"] * 4
