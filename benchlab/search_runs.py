"""The search's runs on this device: a screening run in a fresh process, and the parity verdict.

A candidate is not a variant of params.yaml, so it reaches its fresh process as a file of knob changes
(`--candidate FILE`, read back here and checked by the same rules) and runs there as a variant named
`candidate` added to the loaded params: the bench stage's repeat mode, with bench.steps and
bench.warmup_steps, the memory cap included.
"""

import json
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from benchlab import devlock, launch, parity, search
from benchlab.build import model_shape
from benchlab.config import Params
from benchlab.data import TokenData, load_tokens
from benchlab.env import environment, source_sha256
from benchlab.errors import LabError
from benchlab.knobs import RunSettings
from benchlab.optimize import device_facts, resolve_device
from benchlab.results import base_record, measured_record

NAME = "candidate"


def start_of(p: Params) -> RunSettings:
    """The variant the search starts from, which must be in params.yaml."""
    if p.search.start not in p.variants:
        raise LabError(f"search.start={p.search.start!r} is not a variant in params.yaml; valid: {', '.join(p.variants)}")
    return p.variants[p.search.start]


def with_candidate(p: Params, settings: RunSettings) -> Params:
    """The params with the candidate as one more variant, named `candidate`."""
    return replace(p, variants={**p.variants, NAME: settings})


def read_candidate(p: Params, path: Path) -> RunSettings:
    """The candidate a parent wrote, checked by the knobs' rules as the parent checked it."""
    try:
        changes = json.loads(path.read_text())
        settings = replace(start_of(p), **changes)
    except (OSError, ValueError, TypeError) as err:
        raise LabError(f"{path}: not a search candidate ({type(err).__name__}: {err})") from None
    reason = search.rules_for(device_facts(resolve_device(p.device)), p.batch_size(settings))(settings)
    if reason:
        raise LabError(f"{path}: {reason}")
    return settings


def screen_here(p: Params, candidate: Path, data_dir: str, record_to: Path) -> None:
    """The child's side: one bench run of the candidate, its record written for the parent."""
    launch.one_repeat(with_candidate(p, read_candidate(p, candidate)), NAME, data_dir, record_to)


def context(p: Params, device: torch.device) -> dict[str, Any]:
    """What a journal's runs are only valid for: a change to any of these (the code included) starts the search
    afresh."""
    env = environment()
    start = start_of(p)
    return {"model": p.model, "batch_size": p.batch_size(start), "block_size": p.train.block_size,
            "bench_steps": p.bench.steps, "warmup_steps": p.bench.warmup_steps, "memory_cap_gib": p.bench.memory_cap_gib,
            "device": env.get("gpu") or env.get("cpu") or device.type, "torch": env.get("torch"), "start": asdict(start),
            "parity": asdict(p.parity), "source_sha256": source_sha256()}


class Runs:
    """The measure and judge the search is handed, for one stage run."""

    def __init__(self, p: Params, data_dir: str, reference: dict[str, Any]) -> None:
        self.p, self.data_dir, self.reference = p, data_dir, reference
        self.device = resolve_device(p.device)
        self.data: TokenData = load_tokens(data_dir)

    def measure(self, cand: search.Candidate, settings: RunSettings) -> search.Run:
        began = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="benchlab-search-") as tmp:
            path = Path(tmp) / "candidate.json"
            path.write_text(json.dumps(dict(cand.changes)))
            with devlock.device_lock(self.device, self.p.bench.lock, f"search: {cand.name}"):
                rec = launch.repeat_in_fresh_process(["stages.search", "--candidate", str(path), self.data_dir])
        wall = time.perf_counter() - began
        p = with_candidate(self.p, settings)
        base = base_record(NAME, p, settings, self.device.type, {}, {})
        cfg, n_params = model_shape(p, settings, self.data.vocab_size)
        record = measured_record(base, [rec], cfg, n_params, p.bench.steady_tolerance)
        run = search.Run(cand.name, {}, "", record["status"], tokens_per_sec=record.get("tokens_per_sec"),
                         peak_mem_mb=record.get("peak_mem_allocated_mb") or record.get("peak_rss_mb"), wall_s=wall,
                         message=record.get("message") or "")
        print(f"search: {cand.name}: {run.status}" + (f", {run.tokens_per_sec:.0f} tokens/s, "
              f"{run.peak_mem_mb:.0f} MiB" if run.status == "ok" else f": {run.message}") + f" ({wall:.0f} s)", flush=True)
        return run

    def judge(self, cand: search.Candidate, settings: RunSettings) -> search.Run:
        p = with_candidate(self.p, settings)
        with devlock.device_lock(self.device, p.bench.lock, f"search: parity of {cand.name}"):
            run = parity.train_curve(p, NAME, self.data, self.device, p.parity.seeds[0])
        out = parity.variant_record(p, NAME, run, self.reference, parity.data_passes(p, NAME, self.data))
        print(f"search: parity of {cand.name}: {out['verdict']}", flush=True)
        return search.Run(cand.name, {}, "", run.status, message=out["verdict"], passed=out["learns_same"],
                          extra={"gap_nats": out.get("gap_nats")})
