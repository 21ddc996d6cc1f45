"""benchlab/run/runner.py's loop and benchlab/run/step.py's step, event by event: where the timed window opens and
what is measured inside it, the params each step reads, and what one run's record says. The learning itself is
tests/integration/test_train.py's."""

import json
import os
from contextlib import nullcontext
from dataclasses import replace

import pytest
import torch

from benchlab.core import parent_watch
from benchlab.core.errors import LabError
from benchlab.core.params import Params, RunSettings
from benchlab.run import harness, power, runner
from benchlab.run.apply_knobs import apply
from benchlab.run.data import BatchStream
from benchlab.run.runner import Measurement, train_once
from benchlab.run.schedule import lr_at
from benchlab.run.step import Diverged, LossReader, rank_slice, skipped_steps, to_device, train_step
from model.gpt import GPT, GPTConfig

CPU = torch.device("cpu")


@pytest.fixture()
def events(monkeypatch: pytest.MonkeyPatch) -> list:
    """What the loop does, in order: each step's training, the window's opening, the memory readings."""
    log: list = []
    real_step = runner.train_step
    monkeypatch.setattr(runner, "train_step", lambda run, x, y, clip, micro: (log.append(("step", x.shape[0], clip,
                                                                                           micro)),
                                                                             real_step(run, x, y, clip, micro))[1])
    monkeypatch.setattr(harness, "reset_peaks", lambda device: log.append("reset peaks"))
    readings = iter([10.0, 11.0, 17.5, 12.0])
    monkeypatch.setattr(harness, "current_mb", lambda device: log.append("memory") or next(readings))
    real_start = harness.Neighbours.start
    monkeypatch.setattr(harness.Neighbours, "start", lambda self: (log.append("neighbours"), real_start(self))[1])
    real_meter = power.EnergyMeter.start
    monkeypatch.setattr(power.EnergyMeter, "start", lambda self: (log.append("meter"), real_meter(self))[1])
    monkeypatch.setattr(parent_watch, "at", lambda where: log.append(where))
    return log


class Ticks:
    """runner's clock alone (not the step clock's): one second per reading."""

    def __init__(self) -> None:
        self.perf_counter = iter(range(100, 1000)).__next__  # not from 0: a sum of two readings is no span


def test_the_timed_window_opens_at_the_first_step_after_warm_up(params: Params, tokens, events: list) -> None:
    p = replace(params, optim=replace(params.optim, grad_clip=0.7), shape=replace(params.shape, batch_size=4))
    hooks: list = []
    rec = train_once(p, RunSettings(grad_accum=2), tokens, CPU, steps=5, warmup=2, on_step=lambda: hooks.append(1))
    step = ("step", 4, 0.7, 2)
    assert [e for e in events if e != "memory"] == [
        "step 0 of 5", step, "step 1 of 5", step,
        "step 2 of 5", "reset peaks", "neighbours", "meter", step, "step 3 of 5", step, "step 4 of 5", step]
    assert events.count("memory") == 3 and events[events.index("meter") + 2] == "memory"  # after each timed step
    assert rec.mem_growth_mb == 7.5  # the last timed step's reading less the first's
    assert len(hooks) == 5 and len(rec.step_ms) == 5 and rec.first_step_ms == rec.step_ms[0]
    assert rec.lrs == [lr_at(s, 5, p.optim, RunSettings(grad_accum=2)) for s in range(5)]
    assert rec.warmup_steps == 2 and rec.status == "ok" and rec.val_loss is not None


def test_the_clock_ticks_bound_each_part_of_a_run(params: Params, tokens, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "time", Ticks())
    rec = train_once(params, RunSettings(), tokens, CPU, steps=4, warmup=1)
    # perf_counter ticks once per reading: build began, model built, knobs applied, loop began, each step's end,
    # window opened (step 1), each timed step's start after the first, window closed, evaluation began and ended.
    # Each span is a difference of two ticks.
    assert (rec.init_s, rec.apply_s, rec.setup_s) == (1, 1, 2)
    assert rec.warmup_s == 2 and rec.eval_s == 1  # step 0's end came between
    # three timed steps, two gaps between them, each one tick from a step's end to the next one's start
    assert rec.gap_ms == [1000.0, 1000.0] and rec.window_wall_ms == 6000.0


def test_a_run_draws_its_batches_in_the_order_of_its_data_seed(params: Params, tokens,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    seeds = []
    real = BatchStream.__init__

    def spy(self, data, batch, block, seed):
        seeds.append((batch, block, seed))
        real(self, data, batch, block, seed)

    monkeypatch.setattr(BatchStream, "__init__", spy)
    p = replace(params, seed=5)
    train_once(p, RunSettings(), tokens, CPU, steps=3, warmup=1)
    train_once(p, RunSettings(), tokens, CPU, steps=3, warmup=1, data_seed=9)
    train_once(p, RunSettings(batch_size=8), tokens, CPU, steps=3, warmup=1)
    assert seeds == [(4, 32, 5), (4, 32, 9), (8, 32, 5)]


def test_a_run_caps_memory_by_bench_or_by_its_caller(params: Params, tokens, monkeypatch: pytest.MonkeyPatch) -> None:
    caps = []
    monkeypatch.setattr(harness, "cap_memory", lambda device, cap: caps.append(cap))
    p = replace(params, harness=replace(params.harness, memory_cap_gib=3.5))
    train_once(p, RunSettings(), tokens, CPU, steps=3, warmup=1)
    train_once(p, RunSettings(), tokens, CPU, steps=3, warmup=1, memory_cap_gib=0.0)
    assert caps == [3.5, 0.0]


def test_a_batch_that_does_not_split_is_refused_before_building(params: Params, tokens) -> None:
    with pytest.raises(LabError) as err:
        train_once(params, RunSettings(grad_accum=3), tokens, CPU, steps=3, warmup=1)
    assert str(err.value) == ("batch_size=4 does not split over 1 ranks x grad_accum=3; pick a global batch that is "
                              "a multiple of 3")
    with pytest.raises(LabError, match="batch_size=6 does not split over 1 ranks x grad_accum=4"):
        train_once(params, RunSettings(batch_size=6, grad_accum=4), tokens, CPU, steps=3, warmup=1)


@pytest.mark.parametrize(("split", "name"), [("train", "train"), ("val", "validation")])
def test_a_split_too_short_for_one_window_is_named(params: Params, tokens, split: str, name: str) -> None:
    short = replace(tokens, **{split: getattr(tokens, split)[:20]})
    with pytest.raises(LabError, match=f"longer than the {name} split \\(20 tokens\\)"):
        train_once(params, RunSettings(), short, CPU, steps=3, warmup=1)


def test_each_rank_trains_on_its_own_rows_of_the_global_batch() -> None:
    x, y = torch.arange(24).view(6, 4), torch.arange(6)  # inputs and targets of different shapes
    assert [t.tolist() for t in rank_slice((x, y), 1, 3)] == [x[2:4].tolist(), [2, 3]]
    assert [t.tolist() for t in rank_slice((x, y), 0, 1)] == [x.tolist(), y.tolist()]


def test_a_run_records_who_else_used_the_machine(params: Params, tokens) -> None:
    rec = train_once(params, RunSettings(), tokens, CPU, steps=3, warmup=1)
    assert rec.neighbours["pid"] == os.getpid() and "cpu_busy_others_pct" in rec.neighbours


def test_the_trained_model_is_kept_only_when_asked(params: Params, tokens) -> None:
    kept = train_once(params, RunSettings(), tokens, CPU, steps=3, warmup=1, keep_model=True)
    assert kept.run is not None and isinstance(kept.run.model, torch.nn.Module)
    assert train_once(params, RunSettings(), tokens, CPU, steps=3, warmup=1).run is None
    assert "run" not in json.loads(kept.to_json())  # never serialized
    assert Measurement.from_json(kept.to_json()).losses == kept.losses


def test_a_library_error_is_the_variant_s_result_only_where_the_matrix_goes_on(
        params: Params, tokens, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("triton: no kernel for this shape\nsecond line")

    monkeypatch.setattr(runner, "train_step", broken)
    rec = train_once(params, RunSettings(), tokens, CPU, steps=3, warmup=1, keep_going=True)
    assert (rec.status, rec.message) == ("error", "RuntimeError: triton: no kernel for this shape")
    with pytest.raises(RuntimeError):
        train_once(params, RunSettings(), tokens, CPU, steps=3, warmup=1)

    def stopped(*args: object) -> None:
        raise parent_watch.Stopped("terminated")

    monkeypatch.setattr(runner, "train_step", stopped)
    with pytest.raises(parent_watch.Stopped):
        train_once(params, RunSettings(), tokens, CPU, steps=3, warmup=1, keep_going=True)


def test_a_run_whose_weights_end_broken_is_diverged(params: Params, tokens, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "evaluate", lambda *a, **k: float("nan"))
    rec = train_once(params, RunSettings(), tokens, CPU, steps=3, warmup=1)
    assert (rec.status, rec.diverged_step, rec.val_loss) == ("diverged", 3, None)
    assert rec.message == "loss became nan at step 3"


def test_fp16_skipped_steps_are_counted_from_the_scale() -> None:
    assert skipped_steps([]) is None
    scales = [torch.tensor(v) for v in (65536.0, 32768.0, 32768.0, 16384.0, 32768.0)]
    assert skipped_steps(scales) == 2
    assert skipped_steps([torch.tensor(32768.0)]) == 1  # the first step was skipped too


def test_a_labelled_run_shows_its_progress_on_stdout(params: Params, tokens, capsys: pytest.CaptureFixture[str]) -> None:
    train_once(params, RunSettings(), tokens, CPU, steps=3, warmup=1)
    assert capsys.readouterr() == ("", "")  # unlabelled: quiet
    train_once(params, RunSettings(), tokens, CPU, steps=3, warmup=1, progress="bench@x")
    out, err = capsys.readouterr()
    assert err == "" and "bench@x: 100%" in out and " 3/3 [" in out and "step/s]" in out


def test_a_nan_loss_is_reported_with_its_own_step_and_value() -> None:
    reader = LossReader(CPU)
    for step, value in enumerate([5.0, 4.0, 3.0]):
        reader.push(step, torch.tensor(value))
    reader.push(3, torch.tensor(float("inf")))
    with pytest.raises(Diverged) as err:
        reader.flush()
    assert (err.value.step, err.value.loss, str(err.value)) == (3, float("inf"), "loss became inf at step 3")
    assert reader.values == [5.0, 4.0, 3.0, float("inf")]
    reader.flush()  # nothing pending: nothing read twice
    assert len(reader.values) == 4


def test_a_step_frees_the_gradients_it_used(params: Params) -> None:
    run = apply(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32)), RunSettings(), CPU,
                params.optim)
    x = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(0))
    train_step(run, x, x, grad_clip=1.0)
    assert all(p.grad is None for p in run.model.parameters())  # freed, not zero-filled and kept


def test_the_learning_rate_warms_up_then_decays_to_its_floor_at_the_last_step(params: Params) -> None:
    p = replace(params, optim=replace(params.optim, lr=1.0, min_lr=0.1, lr_warmup_steps=3))
    assert [round(lr_at(s, 5, p.optim, RunSettings()), 6) for s in range(5)] == [round(1 / 3, 6), round(2 / 3, 6), 1.0, 1.0, 0.1]
    # A warm-up not shorter than the run is cut to end one step before its end: that step alone is at optim.lr.
    long = replace(params, optim=replace(params.optim, lr=1.0, min_lr=0.1, lr_warmup_steps=10))
    assert [round(lr_at(s, 4, long.optim, RunSettings()), 6) for s in range(4)] == [round(1 / 3, 6), round(2 / 3, 6), 1.0, 1.0]


class Recorder:
    """A stand-in that records each call made on it by name, with its arguments."""

    def __init__(self, log: list, name: str, result: object = None) -> None:
        self.log, self.name, self.result = log, name, result

    def __call__(self, *args: object, **kwargs: object) -> object:
        self.log.append((self.name, args, kwargs))
        return self.result


def test_a_batch_reaches_a_gpu_through_pinned_memory_without_blocking_the_host() -> None:
    log: list = []

    class Host:
        def __init__(self, name: str) -> None:
            self.name = name

        def pin_memory(self) -> "Host":
            log.append(("pin", self.name))
            return self

        def to(self, *args: object, **kwargs: object) -> tuple:
            log.append(("to", self.name, args, kwargs))
            return ("on device", self.name)

    gpu = torch.device("cuda", 1)
    assert to_device((Host("x"), Host("y")), gpu) == (("on device", "x"), ("on device", "y"))  # type: ignore[arg-type]
    assert log == [("pin", "x"), ("to", "x", (gpu,), {"non_blocking": True}),
                   ("pin", "y"), ("to", "y", (gpu,), {"non_blocking": True})]
    batch = (torch.zeros(2), torch.ones(2))
    assert to_device(batch, CPU) is batch  # a CPU run copies nothing


def test_on_a_gpu_each_loss_is_read_one_step_late_from_pinned_memory_behind_an_event(
        monkeypatch: pytest.MonkeyPatch) -> None:
    log: list = []
    real_empty = torch.empty

    class Host:
        """The pinned host copy: records what is copied into it and when it is read."""

        def __init__(self, shape: tuple, dtype: torch.dtype) -> None:
            self.value = real_empty(shape, dtype=dtype)

        def copy_(self, src: torch.Tensor, **kwargs: object) -> None:
            log.append(("copy", src.item(), kwargs))
            self.value.copy_(src)

        def item(self) -> float:
            log.append(("read", self.value.item(), self.value.dtype))
            return self.value.item()

    class Event:
        def record(self) -> None:
            log.append("record")

        def synchronize(self) -> None:
            log.append("wait")

    def empty(*shape: object, **kwargs: object) -> Host:
        log.append(("empty", shape, kwargs))
        return Host(*shape, dtype=kwargs["dtype"])  # type: ignore[arg-type]

    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    reader = LossReader(torch.device("cuda"))
    reader.push(0, torch.tensor(2.5, dtype=torch.bfloat16))
    reader.push(1, torch.tensor(1.5, dtype=torch.bfloat16))
    assert reader.values == [2.5]  # one step late
    reader.flush()
    pinned = ("empty", ((),), {"dtype": torch.bfloat16, "pin_memory": True})
    assert log == [pinned, ("copy", 2.5, {"non_blocking": True}), "record",
                   pinned, ("copy", 1.5, {"non_blocking": True}), "record", "wait", ("read", 2.5, torch.bfloat16),
                   "wait", ("read", 1.5, torch.bfloat16)]
    assert reader.values == [2.5, 1.5]


def test_a_finished_run_empties_the_gpu_s_cache_and_collects_its_cycles(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list = []
    monkeypatch.setattr(torch.cuda, "empty_cache", Recorder(log, "empty cache"))
    monkeypatch.setattr(runner.gc, "collect", Recorder(log, "collect"))
    runner.release(CPU)
    assert log == [("collect", (), {})]
    runner.release(torch.device("cuda"))
    assert log == [("collect", (), {}), ("collect", (), {}), ("empty cache", (), {})]


def test_a_run_is_released_unless_its_model_is_kept(params: Params, tokens, monkeypatch: pytest.MonkeyPatch) -> None:
    log: list = []
    monkeypatch.setattr(runner, "release", Recorder(log, "release"))
    train_once(params, RunSettings(), tokens, CPU, steps=3, warmup=1)
    assert log == [("release", (CPU,), {})]
    train_once(params, RunSettings(), tokens, CPU, steps=3, warmup=1, keep_model=True)
    assert len(log) == 1


class Scaler:
    """A GradScaler stand-in: records its calls; its scale never changes."""

    def __init__(self, log: list) -> None:
        self.log = log
        self._scale = torch.tensor(65536.0)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        self.log.append(("scale", round(loss.item(), 4)))
        return loss * 4.0

    def unscale_(self, optimizer: object) -> None:
        self.log.append(("unscale", optimizer))

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        self.log.append(("step", optimizer))
        optimizer.step()

    def update(self) -> None:
        self.log.append("update")


def tiny_run(params: Params, settings: RunSettings = RunSettings()):
    return apply(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32)), settings, CPU,
                 params.optim)


def test_an_fp16_step_scales_each_micro_batch_then_unscales_clips_and_steps_through_the_scaler(
        params: Params, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tiny_run(params)
    log: list = []
    run.scaler = Scaler(log)  # type: ignore[assignment]
    monkeypatch.setattr(run, "clip_gradients", lambda clip: log.append(("clip", clip)))
    x = torch.randint(0, 32, (4, 8), generator=torch.Generator().manual_seed(0))
    halves = [round(run.loss(x[i : i + 2], x[i : i + 2]).item() / 2, 4) for i in (0, 2)]  # before the step
    loss = train_step(run, x, x, grad_clip=0.7, micro_batches=2)
    assert log[:2] == [("scale", halves[0]), ("scale", halves[1])]
    assert log[2:] == [("unscale", run.optimizer), ("clip", 0.7), ("step", run.optimizer), "update"]
    assert round(loss.item(), 4) == round(halves[0] + halves[1], 4)


def test_a_step_is_one_micro_batch_unless_told_and_marks_each_cuda_graph_step(
        params: Params, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tiny_run(params)
    log: list = []
    real_loss = run.loss
    run.loss = lambda xs, ys: (log.append(("loss", xs.shape[0])), real_loss(xs, ys))[1]
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", Recorder(log, "mark"))
    x = torch.randint(0, 32, (4, 8), generator=torch.Generator().manual_seed(0))
    train_step(run, x, x, grad_clip=1.0)
    assert log == [("loss", 4)]
    run.settings = replace(run.settings, compile_mode="reduce-overhead")
    train_step(run, x, x, grad_clip=1.0, micro_batches=2)
    assert log[1:] == [("mark", (), {}), ("loss", 2), ("mark", (), {}), ("loss", 2)]


def test_an_fp16_run_counts_the_steps_its_scaler_skipped(params: Params, tokens, monkeypatch: pytest.MonkeyPatch) -> None:
    real_apply = runner.apply

    def with_scaler(*args: object):
        run = real_apply(*args)
        run.scaler = Scaler([])
        return run

    monkeypatch.setattr(runner, "apply", with_scaler)
    assert train_once(params, RunSettings(), tokens, CPU, steps=3, warmup=1).skipped_steps == 0
    monkeypatch.setattr(runner, "apply", real_apply)
    assert train_once(params, RunSettings(), tokens, CPU, steps=3, warmup=1).skipped_steps is None  # no scaler


def test_under_torchrun_each_rank_trains_its_share_and_the_record_names_the_ranks(
        params: Params, tokens, events: list, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    rows: list = []
    real_slice = runner.rank_slice
    monkeypatch.setattr(runner, "rank_slice", lambda batch, rank, world: (rows.append((rank, world)),
                                                                          real_slice(batch, rank, world))[1])
    alone = train_once(params, RunSettings(), tokens, CPU, steps=2, warmup=1)  # the variables, but no process group
    assert alone.world_size == 1 and rows == [(0, 1), (0, 1)]
    assert [e[1] for e in events if e[0] == "step"] == [4, 4]
    monkeypatch.setattr(runner.dist, "active", lambda: True)
    ranked = train_once(params, RunSettings(), tokens, CPU, steps=2, warmup=1)
    assert ranked.world_size == 2 and rows[2:] == [(1, 2), (1, 2)]
    assert [e[1] for e in events if e[0] == "step"][2:] == [2, 2]  # half of the global batch of 4


def test_validation_runs_on_the_run_s_device_under_its_autocast(params: Params, tokens,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list = []

    def spy(model, p, data, device, autocast=None) -> float:
        seen.append((device, autocast))
        return 1.0

    monkeypatch.setattr(runner, "evaluate", spy)
    real_apply = runner.apply
    marker = nullcontext()

    def marked(*args: object):
        run = real_apply(*args)
        run.autocast = lambda: marker  # type: ignore[method-assign]
        return run

    monkeypatch.setattr(runner, "apply", marked)
    train_once(params, RunSettings(), tokens, CPU, steps=2, warmup=1)
    assert seen == [(CPU, marker)]


def test_evaluate_feeds_the_batches_to_the_device_it_is_given(params: Params, tokens) -> None:
    devices: list = []

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[None, torch.Tensor]:
            devices.append((x.device.type, y.device.type))
            return None, torch.tensor(2.0)

    assert runner.evaluate(Model(), params, tokens, torch.device("meta")) == 2.0
    assert devices and set(devices) == {("meta", "meta")}  # a device with no data: a CPU copy would show


@pytest.mark.parametrize(("text", "message"), [("", "RuntimeError: "), ("  \n", "RuntimeError: "),
                                               ("y" * 320 + "\nz", "RuntimeError: " + "y" * 300)])
def test_a_library_error_s_message_is_its_first_line_cut_at_300_characters(
        params: Params, tokens, monkeypatch: pytest.MonkeyPatch, text: str, message: str) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError(text)

    monkeypatch.setattr(runner, "train_step", broken)
    rec = train_once(params, RunSettings(), tokens, CPU, steps=3, warmup=1, keep_going=True)
    assert (rec.status, rec.message) == ("error", message)


def test_the_progress_bar_refreshes_at_most_every_five_seconds(params: Params, tokens,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list = []
    real = runner.tqdm
    monkeypatch.setattr(runner, "tqdm", lambda it, **kw: (seen.append(kw["mininterval"]), real(it, **kw))[1])
    train_once(params, RunSettings(), tokens, CPU, steps=2, warmup=1, progress="bench@x")
    assert seen == [5.0]


def test_a_run_records_every_step_s_loss_the_last_included(params: Params, tokens,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader reads each loss one step late, so the last step's is read only by the flush after the loop."""
    real_step = runner.train_step
    seen: list[float] = []

    def step(run, x, y, clip, micro):
        loss = real_step(run, x, y, clip, micro)
        seen.append(loss.item())
        return loss

    monkeypatch.setattr(runner, "train_step", step)
    rec = train_once(params, RunSettings(), tokens, CPU, steps=5, warmup=2)
    assert rec.status == "ok" and len(seen) == 5
    assert rec.losses == seen  # every step once, in order, the fifth too


def test_a_loss_that_turns_nan_at_the_last_step_ends_the_run_diverged(params: Params, tokens,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    real_step = runner.train_step
    steps = iter(range(100))

    def step(run, x, y, clip, micro):
        loss = real_step(run, x, y, clip, micro)
        return loss * float("nan") if next(steps) == 3 else loss

    monkeypatch.setattr(runner, "train_step", step)
    rec = train_once(params, RunSettings(), tokens, CPU, steps=4, warmup=1)
    assert (rec.status, rec.diverged_step, rec.message) == ("diverged", 3, "loss became nan at step 3")
