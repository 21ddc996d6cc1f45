"""The search's runs on this device: screening on a persistent worker, confirmation in fresh processes, parity.

**Screening** on a GPU runs on one long-lived worker process (`python -m stages.search DATA --worker`): the
interpreter, torch, the tokens and the CUDA context are paid for once, not once per candidate. Each
candidate still builds its model from the seeded weights, applies its knobs, compiles, warms up
(bench.warmup_steps) and times search.screen_steps steps; between candidates the worker drops every compiled
graph (torch._dynamo.reset), collects and empties the allocator's cache, so a candidate starts from an empty
device and its peak is its own. What a fresh process would add is a clean allocator and compiler state,
which the finalists get: **confirmation** repeats each in a fresh process, the bench stage's repeat mode with
bench.steps. On a CPU, screening runs in fresh processes too: its only memory figure is a process's lifetime
peak. inductor's caches (FX graphs, autotuning, Triton kernels) live in one folder, the project's
`benchlab.core.stage_main.COMPILE_CACHE`, for every process of the search, later searches and the pipeline's
stages, so a graph compiled once is not compiled again.

A candidate is not a variant of params.yaml, so it reaches a process as its knob changes (JSON), checked
there by the same rules, and runs as a variant named `candidate`.
"""

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import IO, Any

import torch

from benchlab.core import locks, parent_watch
from benchlab.core.errors import LabError
from benchlab.core.knobs import CUDA_GRAPH_MODES, RunSettings
from benchlab.core.params import Params
from benchlab.core.record import compared_memory
from benchlab.run import launch, parity
from benchlab.run.build_model import model_shape
from benchlab.run.data import TokenData, load_tokens
from benchlab.run.env import environment, source_sha256
from benchlab.run.hardware import device_facts, resolve_device
from benchlab.run.harness import process_age_s
from benchlab.run.results import base_record, measured_record
from benchlab.run.runner import RunRecord, release, train_once
from benchlab.search import moves, strategy
from benchlab.search.journal import Run

NAME = "candidate"
# The loggers whose records a search keeps out of the terminal, and the variable naming their file for its children.
LIBRARIES = ("torch", "torchao")
LOG_ENV = "BENCHLAB_SEARCH_LOG"


def libraries_to_log(path: str | Path) -> None:
    """Send the libraries' log records (torchao's "Failed to load ... .so" for kernels this machine lacks, torch's
    deprecation warnings) to the file at `path`, appended, not to the terminal: a search prints its own lines. The
    processes the search starts inherit the path (LOG_ENV) and do the same."""
    os.environ[LOG_ENV] = str(Path(path).resolve())
    handler = logging.FileHandler(os.environ[LOG_ENV], encoding="utf-8", delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s pid %(process)d %(name)s %(levelname)s: %(message)s"))
    for name in LIBRARIES:
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]  # torch installs its own handler on "torch", writing to stderr
        logger.propagate = False


def start_of(p: Params) -> RunSettings:
    """The variant the search starts from (params load checks one the user set; this, the default)."""
    if p.search.start not in p.variants:
        raise LabError(f"search.start={p.search.start!r} is not valid; expected {', '.join(p.variants)}")
    return p.variants[p.search.start]


def with_candidate(p: Params, settings: RunSettings) -> Params:
    """The params with the candidate as one more variant, named `candidate`."""
    return replace(p, variants={**p.variants, NAME: settings})


def read_candidate(p: Params, text: str, where: str) -> RunSettings:
    """The candidate a parent sent, checked by the knobs' rules as the parent checked it."""
    try:
        settings = replace(start_of(p), **json.loads(text))
    except (ValueError, TypeError) as err:
        raise LabError(f"{where}: not a search candidate ({type(err).__name__}: {str(err)[:200]})") from None
    reason = moves.rules_for(device_facts(resolve_device(p.device)), p.batch_size(settings))(settings)
    if reason:
        raise LabError(f"{where}: {reason}")
    return settings


def screen_here(p: Params, candidate: Path, data_dir: str, record_to: Path, steps: int | None = None) -> None:
    """A fresh process's side: one bench run of the candidate (bench.steps, or `steps`), its record written for the
    parent."""
    if steps is not None:
        p = replace(p, bench=replace(p.bench, steps=steps))
    launch.one_repeat(with_candidate(p, read_candidate(p, candidate.read_text(), str(candidate))), NAME, data_dir,
                      record_to)


def serve(p: Params, data_dir: str) -> None:
    """The screening worker: one candidate per line of stdin (its changes, JSON), one record per line of the
    original stdout; progress and logs go to stderr."""
    replies: IO[str] = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything printed now (progress bars, compiler logs) goes to stderr, not into the replies
    device = resolve_device(p.device)
    data = load_tokens(data_dir)
    startup = process_age_s()
    for line in sys.stdin:
        rec = screen_one(p, line, data, device)
        rec.startup_s, startup = startup, None  # the worker's start is paid by its first candidate
        replies.write(rec.to_json() + "\n")
        replies.flush()


def screen_one(p: Params, line: str, data: TokenData, device: torch.device) -> RunRecord:
    """One screening run in the worker; a candidate the rules or the run refuse is its record, not the worker's end."""
    try:
        settings = screening_settings(read_candidate(p, line, "the screening worker"), p.search.screen_compile_scope)
        steps = p.bench.warmup_steps + p.search.screen_steps
        return train_once(with_candidate(p, settings), settings, data, device, steps, p.bench.warmup_steps,
                          keep_going=True)
    except LabError as err:
        return RunRecord(status="error", message=str(err))
    finally:
        torch._dynamo.reset()  # the next candidate compiles its own graphs (from the cache where it can)
        release(device)


def screening_settings(settings: RunSettings, scope: str) -> RunSettings:
    """The candidate as a screening run compiles it: under search.screen_compile_scope=blocks each block on its own
    (regional compilation), where the candidate compiles and its mode captures no CUDA graphs."""
    if scope == "blocks" and settings.compile and settings.compile_mode not in CUDA_GRAPH_MODES:
        return replace(settings, compile_scope="blocks")
    return settings


class Worker:
    """The parent's handle on the screening worker: started on first use, started again after it dies."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.proc: subprocess.Popen | None = None

    def screen(self, changes: dict[str, Any]) -> RunRecord:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, "-m", "stages.search", self.data_dir, "--worker"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                         preexec_fn=parent_watch.die_with_parent)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(changes) + "\n")
            self.proc.stdin.flush()
            reply = self.proc.stdout.readline()
        except BrokenPipeError:
            reply = ""
        if reply:
            return RunRecord.from_json(reply)
        code = self.proc.wait()
        self.proc = None
        if code in (2, 130, 143) or parent_watch.signalled():  # the user's error or a stop: the search cannot go on
            raise LabError(f"the screening worker stopped (exit {code}); nothing more screened")
        return RunRecord(status="error", message=f"the screening worker died (exit {code}) on this candidate")

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None


def context(p: Params, device: torch.device) -> dict[str, Any]:
    """What a journal's runs are only valid for: a change to any of these (the code included) starts the search
    afresh. `device`, `torch` and the cap also say which earlier answers may warm-start it."""
    env = environment()
    start = start_of(p)
    return {"model": p.model, "batch_size": p.batch_size(start), "block_size": p.train.block_size,
            "bench_steps": p.bench.steps, "warmup_steps": p.bench.warmup_steps, "screen_steps": p.search.screen_steps,
            "memory_cap_gib": p.bench.memory_cap_gib, "device": env.get("gpu") or env.get("cpu") or device.type,
            "torch": env.get("torch"), "start": asdict(start), "parity": asdict(p.parity),
            "source_sha256": source_sha256()}


def warm_starts(p: Params, found: list[tuple[str, dict[str, Any]]]) -> list[strategy.Warm]:
    """The best answers known here: the variants of aggregate.ours, then earlier searches' answers on this device
    at other sizes (the journal's), each once."""
    out = [strategy.Warm(name, p.variants[name]) for name in p.aggregate.ours if name in p.variants]
    for label, values in found:
        try:
            out.append(strategy.Warm(label, RunSettings(**values)))
        except TypeError:
            continue  # an answer from a knob table this code no longer has
    unique: dict[RunSettings, strategy.Warm] = {}
    for warm in out:
        unique.setdefault(warm.settings, warm)
    return list(unique.values())


def spread(record: dict[str, Any]) -> float | None:
    """The run's speed spread as a share: half the p10-p90 range of its step times over their median (the search
    takes speeds closer than this for ties on its front)."""
    p10, p90, median = (record.get(k) for k in ("step_ms_p10", "step_ms_p90", "step_ms_median"))
    return (p90 - p10) / (2 * median) if p10 is not None and p90 is not None and median else None


def breakdown(rec: RunRecord, wall_s: float) -> dict[str, float | None]:
    """Where a run's wall time went, for the candidates file (search_report.BREAKDOWN)."""
    timed = rec.window_wall_ms / 1000 if rec.window_wall_ms is not None else None
    return {"startup_s": rec.startup_s, "build_s": rec.init_s, "apply_s": rec.apply_s, "warmup_s": rec.warmup_s,
            "timed_s": timed, "eval_s": rec.eval_s, "other_s": wall_s - sum(
                v or 0 for v in (rec.startup_s, rec.init_s, rec.apply_s, rec.warmup_s, timed, rec.eval_s))}


class Runs:
    """The screen, repeat and judge the search is handed, for one stage run."""

    def __init__(self, p: Params, data_dir: str, reference: dict[str, Any]) -> None:
        self.p, self.data_dir, self.reference = p, data_dir, reference
        self.device = resolve_device(p.device)
        self.data: TokenData = load_tokens(data_dir)
        self.worker = Worker(data_dir)

    def _run(self, cand: moves.Candidate, settings: RunSettings, rec: RunRecord, wall: float, what: str) -> Run:
        p = with_candidate(self.p, settings)
        base = base_record(NAME, p, settings, self.device.type, {}, {})
        cfg, n_params = model_shape(p, settings, self.data.vocab_size)
        record = measured_record(base, [rec], cfg, n_params, p.bench.steady_tolerance)
        run = Run(cand.name, {}, "", record["status"], tokens_per_sec=record.get("tokens_per_sec"),
                  peak_mem_mb=compared_memory(record), wall_s=wall,
                  message=record.get("message") or "", extra={**breakdown(rec, wall), "tps_spread": spread(record)})
        print(f"search: {what} {cand.name}: {run.status}" + (f", {run.tokens_per_sec:,.0f} tokens/s, "
              f"{run.peak_mem_mb:,.0f} MiB" if run.status == "ok" else f": {run.message}") + f" ({wall:.1f} s)",
              flush=True)
        return run

    def screen(self, cand: moves.Candidate, settings: RunSettings) -> Run:
        """A short run on the worker. On a CPU, in a fresh process instead: there the only memory figure is the
        process's lifetime peak, which a worker would carry from one candidate to the next."""
        if self.device.type != "cuda":
            return self.repeat(cand, settings, steps=self.p.bench.warmup_steps + self.p.search.screen_steps)
        began = time.perf_counter()
        with locks.device_lock(self.device, self.p.bench.lock, f"search: {cand.name}"):
            rec = self.worker.screen(dict(cand.changes))
        return self._run(cand, settings, rec, time.perf_counter() - began, "screened")

    def repeat(self, cand: moves.Candidate, settings: RunSettings, steps: int | None = None) -> Run:
        """One run in a fresh process: bench.steps, or `steps` (a CPU's screening run)."""
        began = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="benchlab-search-") as tmp:
            path = Path(tmp) / "candidate.json"
            path.write_text(json.dumps(dict(cand.changes)))
            args = ["stages.search", "--candidate", str(path), self.data_dir] + \
                (["--steps", str(steps)] if steps is not None else [])
            with locks.device_lock(self.device, self.p.bench.lock, f"search: {cand.name}"):
                self.worker.close()  # a fresh process has the device to itself
                rec = launch.repeat_in_fresh_process(args)
        what = "repeated in a fresh process" if steps is None else "screened in a fresh process"
        return self._run(cand, settings, rec, time.perf_counter() - began, what)

    def judge(self, cand: moves.Candidate, settings: RunSettings) -> Run:
        began = time.perf_counter()
        p = with_candidate(self.p, settings)
        with locks.device_lock(self.device, p.bench.lock, f"search: parity of {cand.name}"):
            self.worker.close()
            run = parity.train_curve(p, NAME, self.data, self.device, p.parity.seeds[0])
        out = parity.variant_record(p, NAME, run, self.reference, parity.data_passes(p, NAME, self.data))
        wall = time.perf_counter() - began
        print(f"search: parity of {cand.name}: {out['verdict']} ({wall:.0f} s)", flush=True)
        return Run(cand.name, {}, "", run.status, message=out["verdict"], passed=out["learns_same"], wall_s=wall,
                   extra={"gap_nats": out.get("gap_nats")})
