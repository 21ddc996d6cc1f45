"""The search's runs on this device: screening (on the worker, worker.py), compiling ahead, confirmation in fresh
processes, parity: `Runs`, the protocol.Device that the stage hands strategy.Search.

What a fresh process adds to a screening run is a clean allocator and compiler state, which the finalists get:
**confirmation** repeats each in a fresh process, the bench stage's repeat mode with bench.steps, compiled as the
candidate asks (whole-model by default). inductor's caches (FX graphs, autotuning, Triton kernels) live in one
folder, `benchlab.core.stage_main.compile_cache()`, for every process of the search, later searches and the
pipeline's stages, so a graph compiled once is not compiled again.
"""

import json
import os
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from benchlab.core import locks
from benchlab.core.params import Params
from benchlab.core.record import compared_memory
from benchlab.core.knobs import RunSettings
from benchlab.run import launch, parity
from benchlab.run.build_model import model_shape
from benchlab.run.data import TokenData, load_tokens
from benchlab.run.env import environment, source_sha256
from benchlab.run.hardware import resolve_device
from benchlab.run.records import base_record, measured_record
from benchlab.run.runner import Measurement
from benchlab.search import moves, worker
from benchlab.search.budget import Limits
from benchlab.search.journal import Entry
from benchlab.search.worker import NAME, Worker, start_of, with_candidate


def context(p: Params, device: torch.device) -> dict[str, Any]:
    """What a journal's runs are only valid for: a change to any of these (the code included) starts the search
    afresh. `device`, `torch` and the cap also say which earlier answers may warm-start it."""
    env = environment()
    start = start_of(p)
    return {"model": p.model, "batch_size": p.batch_size(start), "block_size": p.shape.block_size,
            "bench_steps": p.bench.steps, "warmup_steps": p.harness.warmup_steps, "screen_steps": p.search.screen_steps,
            "memory_cap_gib": p.harness.memory_cap_gib, "device": env.get("gpu") or env.get("cpu") or device.type,
            "torch": env.get("torch"), "start": asdict(start), "parity": parity_context(p), "source_sha256": source_sha256()}


def parity_context(p: Params) -> dict[str, Any]:
    """The parity settings a verdict depends on; not parity.variants, the matrix's list, which the search never reads."""
    q = p.parity
    return {"reference": q.reference, "steps": q.steps, "tail_steps": q.tail_steps, "tolerance": q.tolerance,
            "seeds": list(q.seeds)}


def limits(p: Params) -> Limits:
    """The stage's limits: its budget and runs, lean's floor, and the tokens a parity verdict trains (with the start's
    speed, what a verdict costs); CUDA graphs and max-autotune tried on the fastest finalist alone."""
    start = start_of(p)
    return Limits(p.search.budget_s, p.search.max_candidates, p.search.confirm, p.search.repeats, p.search.lean_floor,
                  parity_tokens=p.parity.steps * p.batch_size(start) * p.shape.block_size, seed=p.seed,
                  finalist_only=True)


def warm_starts(p: Params, found: list[tuple[str, dict[str, Any]]]) -> list[moves.Warm]:
    """The best answers known here: the variants of aggregate.ours, then earlier searches' answers on this device
    at other sizes (the journal's), each once."""
    out = [moves.Warm(name, p.variants[name]) for name in p.aggregate.ours if name in p.variants]
    for label, values in found:
        try:
            out.append(moves.Warm(label, RunSettings(**values)))
        except TypeError:
            continue  # an answer from a knob table this code no longer has
    unique: dict[RunSettings, moves.Warm] = {}
    for warm in out:
        unique.setdefault(warm.settings, warm)
    return list(unique.values())


def spread(record: dict[str, Any]) -> float | None:
    """The run's speed spread as a share: half the p10-p90 range of its step times over their median (the search
    takes speeds closer than this for ties on its front)."""
    p10, p90, median = (record.get(k) for k in ("step_ms_p10", "step_ms_p90", "step_ms_median"))
    return (p90 - p10) / (2 * median) if p10 is not None and p90 is not None and median else None


def breakdown(rec: Measurement, wall_s: float) -> dict[str, float | None]:
    """Where a run's wall time went, for the candidates file (report.BREAKDOWN)."""
    timed = rec.window_wall_ms / 1000 if rec.window_wall_ms is not None else None
    return {"startup_s": rec.startup_s, "build_s": rec.init_s, "apply_s": rec.apply_s, "warmup_s": rec.warmup_s,
            "timed_s": timed, "eval_s": rec.eval_s, "other_s": wall_s - sum(
                v or 0 for v in (rec.startup_s, rec.init_s, rec.apply_s, rec.warmup_s, timed, rec.eval_s)),
            "compile_hits": rec.compile_hits, "compile_misses": rec.compile_misses}


class Runs:
    """The screen, repeat and judge the search is handed, for one stage run."""

    def __init__(self, p: Params, data_dir: str, reference: dict[str, Any]) -> None:
        self.p, self.data_dir, self.reference = p, data_dir, reference
        self.device = resolve_device(p.device)
        self.data: TokenData = load_tokens(data_dir)
        self.worker = Worker(data_dir)
        self.compiled: set[RunSettings] = set()  # what this search's processes have compiled ahead

    def _run(self, cand: moves.Candidate, settings: RunSettings, rec: Measurement, wall: float, what: str) -> Entry:
        p = with_candidate(self.p, settings)
        base = base_record(NAME, p, settings, self.device.type, {}, {}, own=None)
        cfg, n_params = model_shape(p, settings, self.data.vocab_size)
        record = measured_record(base, [rec], cfg, n_params, p.harness.steady_tolerance)
        run = Entry(cand.name, {}, "", record["status"], tokens_per_sec=record.get("tokens_per_sec"),
                  peak_mem_mb=compared_memory(record), wall_s=wall,
                  message=record.get("message") or "", extra={**breakdown(rec, wall), "tps_spread": spread(record)})
        print(f"search: {what} {cand.name}: {run.status}" + (f", {run.tokens_per_sec:,.0f} tokens/s, "
              f"{run.peak_mem_mb:,.0f} MiB" if run.status == "ok" else f": {run.message}") + f" ({wall:.1f} s)",
              flush=True)
        return run

    def screen(self, cand: moves.Candidate, settings: RunSettings) -> Entry:
        """A short run on the worker. On a CPU, in a fresh process instead: there the only memory figure is the
        process's lifetime peak, which a worker would carry from one candidate to the next."""
        if self.device.type != "cuda":
            return self.repeat(cand, settings, steps=self.p.harness.warmup_steps + self.p.search.screen_steps)
        began = time.perf_counter()
        with locks.device_lock(self.device, self.p.harness.lock, f"search: {cand.name}"):
            rec = self.worker.screen(dict(cand.changes))
        return self._run(cand, settings, rec, time.perf_counter() - began, "screened")

    def prepare(self, batch: list[tuple[moves.Candidate, RunSettings]]) -> Entry | None:
        """Compile the batch's candidates ahead, at once (worker.precompile), where screening compiles by blocks on a
        GPU and search.precompile_processes is not 0; each graph once. None where nothing was compiled."""
        scope, processes = self.p.search.screen_compile_scope, self.p.search.precompile_processes
        if self.device.type != "cuda" or processes == 0:
            return None
        todo = {key: cand for cand, settings in batch
                if (key := worker.ahead(settings, scope)) is not None and key not in self.compiled}
        if not todo:
            return None
        print(f"search: compiling {len(todo)} candidates ahead, {min(processes, len(todo))} at a time", flush=True)
        with locks.device_lock(self.device, self.p.harness.lock, "search: compiling ahead"):
            cost = worker.precompile(list(todo), self.data_dir, processes, os.cpu_count() or 1)
        self.compiled |= set(todo)
        print(f"search: compiled ahead in {cost['wall_s']:.1f} s" + (f", {cost['precompile_failed']} failed (they "
              "compile when screened)" if cost["precompile_failed"] else ""), flush=True)
        return Entry("", {}, "", "ok", wall_s=cost.pop("wall_s"),
                   extra={**cost, "candidates": [cand.name for cand in todo.values()]})

    def repeat(self, cand: moves.Candidate, settings: RunSettings, steps: int | None = None) -> Entry:
        """One run in a fresh process: bench.steps, or `steps` (a CPU's screening run)."""
        began = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="benchlab-search-") as tmp:
            path = Path(tmp) / "candidate.json"
            path.write_text(json.dumps(dict(cand.changes)))
            args = ["stages.search_worker", "--candidate", str(path), self.data_dir] + \
                (["--steps", str(steps)] if steps is not None else [])
            with locks.device_lock(self.device, self.p.harness.lock, f"search: {cand.name}"):
                self.worker.close()  # a fresh process has the device to itself
                rec = launch.repeat_in_fresh_process(args)
        what = "repeated in a fresh process" if steps is None else "screened in a fresh process"
        return self._run(cand, settings, rec, time.perf_counter() - began, what)

    def judge(self, cand: moves.Candidate, settings: RunSettings) -> Entry:
        began = time.perf_counter()
        p = with_candidate(self.p, settings)
        with locks.device_lock(self.device, p.harness.lock, f"search: parity of {cand.name}"):
            self.worker.close()
            run = parity.train_curve(p, NAME, self.data, self.device, p.parity.seeds[0])
        out = parity.variant_record(p, NAME, run, self.reference, parity.data_passes(p, NAME, self.data))
        wall = time.perf_counter() - began
        print(f"search: parity of {cand.name}: {out['verdict']} ({wall:.0f} s)", flush=True)
        return Entry(cand.name, {}, "", run.status, message=out["verdict"], passed=out["learns_same"], wall_s=wall,
                   extra={"gap_nats": out.get("gap_nats")})
