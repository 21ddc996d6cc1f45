"""The search's processes: the screening worker, the fresh-process runs, and the compiling ahead.

**Screening** on a GPU runs on one long-lived worker process (`python -m stages.search_worker DATA --worker`): the
interpreter, torch, the tokens and the CUDA context are paid for once, not once per candidate. Each candidate
still builds its model from the seeded weights, applies its knobs, compiles (from the cache where it can), warms up
(harness.warmup_steps) and times search.screen_steps steps; between candidates the worker drops every compiled graph
(torch._dynamo.reset), collects and empties the allocator's cache, so a candidate starts from an empty device and
its peak is its own. On a CPU, screening runs in fresh processes (runs.Runs.screen): its only memory figure is a
process's lifetime peak.

**Compiling ahead.** Under search.screen_compile_scope=blocks a candidate compiles one block (every block runs its
code, whatever the depth) and its loss head. Those graphs are the same on a model of one layer, so before a batch
of screening runs the search compiles its candidates at once, each in its own process on a one-layer model of the
same width (search.precompile_processes of them at a time, each with a share of the cores): the worker's
full-depth run then loads the graphs from inductor's cache (`compile_hits`, `compile_misses` in its record say
whether it did). Nothing is timed while they run. Knobs outside the model's graphs (the optimizer's) cost no
compile: candidates that differ only there are compiled once.

A candidate is not a variant of params.yaml, so it reaches a process as its knob changes (JSON), checked there by
the same rules, and runs as a variant named `candidate`.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

import torch

from benchlab.core import param_reads, parent_watch
from benchlab.core.errors import LabError
from benchlab.core.knobs import CUDA_GRAPH_MODES, KNOBS, RunSettings
from benchlab.core.params import Params, with_changes
from benchlab.run import launch
from benchlab.run.data import TokenData, load_tokens
from benchlab.run.hardware import device_facts, resolve_device
from benchlab.run.harness import process_age_s
from benchlab.run.runner import Measurement, release, train_once
from benchlab.search import moves

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
    return with_changes(p, variants={**p.variants, NAME: settings})


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
        with param_reads.quiet():  # bench.steps replaced: not read
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


def screen_one(p: Params, line: str, data: TokenData, device: torch.device) -> Measurement:
    """One screening run in the worker; a candidate the rules or the run refuse is its record, not the worker's end."""
    try:
        settings = screening_settings(read_candidate(p, line, "the screening worker"), p.search.screen_compile_scope)
        steps = p.harness.warmup_steps + p.search.screen_steps
        return counted(lambda: train_once(with_candidate(p, settings), settings, data, device, steps,
                                          p.harness.warmup_steps, keep_going=True))
    except LabError as err:
        return Measurement(status="error", message=str(err))
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

    def screen(self, changes: dict[str, Any]) -> Measurement:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, "-m", "stages.search_worker", self.data_dir, "--worker"],
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
            return Measurement.from_json(reply)
        code = self.proc.wait()
        self.proc = None
        if code in (2, 130, 143) or parent_watch.signalled():  # the user's error or a stop: the search cannot go on
            raise LabError(f"the screening worker stopped (exit {code}); nothing more screened")
        return Measurement(status="error", message=f"the screening worker died (exit {code}) on this candidate")

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None


def counted(run: Any) -> Measurement:
    """`run()`'s record with inductor's FX graph cache hits and misses during it."""
    from torch._dynamo.utils import counters

    counters["inductor"].clear()
    rec: Measurement = run()
    rec.compile_hits = int(counters["inductor"]["fxgraph_cache_hit"])
    rec.compile_misses = int(counters["inductor"]["fxgraph_cache_miss"])
    return rec


# ---- compiling ahead ----

PRECOMPILE_LAYERS = 1  # the depth a candidate's graphs are compiled ahead on
PRECOMPILE_STEPS = 2  # one step compiles the training graphs; the second checks they need no recompile
OUTSIDE_GRAPHS = ("optimizer", "fused_clip")  # knobs that change no graph of a model compiled by blocks


def ahead(settings: RunSettings, scope: str) -> RunSettings | None:
    """What compiling the candidate ahead compiles (its screening settings with the knobs outside the model's
    graphs at their defaults, so candidates that differ only there share it); None where the graphs depend on the
    depth: whole-model compilation, or none."""
    screened = screening_settings(settings, scope)
    if not screened.compile or screened.compile_scope != "blocks":
        return None
    return replace(screened, **{k: getattr(RunSettings(), k) for k in OUTSIDE_GRAPHS})


def precompile_here(p: Params, candidate: Path, data_dir: str) -> None:
    """A compiling-ahead process's side: two steps and the evaluation of the candidate on a one-layer model, which
    leaves its block's and loss head's graphs in the cache."""
    settings = read_candidate(p, candidate.read_text(), str(candidate))
    device = resolve_device(p.device)
    rec = counted(lambda: train_once(with_candidate(p, settings), settings, load_tokens(data_dir), device,
                                     PRECOMPILE_STEPS, 1, keep_going=True, n_layer=PRECOMPILE_LAYERS))
    print(f"search: compiled ahead: {rec.status}, {rec.compile_misses} graphs compiled, {rec.compile_hits} from "
          f"the cache {rec.message}", flush=True)
    if rec.status not in ("ok", "diverged"):
        raise LabError(f"compiling ahead: {rec.status}: {rec.message}")


def precompile(batch: list[RunSettings], data_dir: str, processes: int, cores: int) -> dict[str, Any]:
    """Compile each of `batch` ahead in its own process, `processes` at a time, each given its share of `cores`
    for inductor's compile workers; wait for all. What it cost: wall time, and how many processes failed (their
    candidates compile in the worker instead)."""
    began = time.perf_counter()
    threads = max(1, cores // max(1, min(processes, len(batch))))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TORCHINDUCTOR_COMPILE_THREADS": str(threads)}
    log = os.environ.get(LOG_ENV)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="benchlab-ahead-") as tmp:
        waiting, running = list(enumerate(batch)), []
        with (open(log, "a", encoding="utf-8") if log else open(os.devnull, "w")) as sink:
            while waiting or running:
                while waiting and len(running) < processes:
                    i, settings = waiting.pop(0)
                    path = Path(tmp) / f"candidate-{i}.json"
                    path.write_text(json.dumps({k: getattr(settings, k) for k in KNOBS}))
                    running.append(subprocess.Popen(
                        [sys.executable, "-m", "stages.search_worker", data_dir, "--precompile", str(path)], env=env,
                        stdin=subprocess.DEVNULL, stdout=sink, stderr=sink, preexec_fn=parent_watch.die_with_parent))
                done = running.pop(0)
                code = done.wait()
                failed += code != 0
                if code in (130, 143) or parent_watch.signalled():
                    raise LabError(f"compiling ahead was stopped (exit {code})")
    return {"precompiled": len(batch), "precompile_failed": failed, "precompile_processes": processes,
            "wall_s": time.perf_counter() - began}
