"""Where a variant's runs happen: in this process, in a fresh process per repeat, or on torchrun's ranks.

bench.repeats runs of a variant (`run_repeats`): one runs in the stage's own process (DVC started it fresh);
more run each in a fresh process (`repeat_in_fresh_process`), so no repeat inherits another's allocator,
caches or clocks. The child is the same stage in its repeat mode (`one_repeat`), which writes its record
for the parent to read.

A `parallel` variant (ddp, fsdp2) runs every repeat under torchrun, PyTorch's own launcher:
`python -m torch.distributed.run --standalone --nproc_per_node=N -m stages.bench --variant NAME ...
--record-to FILE`. Each rank joins the process group (`rank_device`), trains on its slice of the same global
batch, and the ranks gather their records; `combine_ranks` turns them into the job's record (a step takes as
long as its slowest rank, its loss is the ranks' mean), which the first rank of each node writes for the
parent, the process that keeps the device lock and writes the result. Merging lives here, beside the
gathering and the writing, because only a launch that splits one run over processes has ranks to merge;
the runner trains one process's share and knows no other. A rank that dies fails the stage with nothing
recorded, and `last_words` picks the line that says why from the child's stderr. The profile stage runs its
ranks the same way (`on_ranks`, `rank_device`, `train_variant`); they write its trace themselves.

A scripted run with a time limit may set BENCHLAB_DEADLINE, a Unix time: a variant then
starts no repeat that its shortest repeat so far says would end past it, and records the repeats it has,
saying how many of `bench.repeats` ran; a variant reaching the deadline before its first repeat fails with
nothing recorded. Without it, every variant runs all its repeats.
"""

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch

from benchlab.core import param_reads, parent_watch
from benchlab.core.errors import LabError
from benchlab.core.params import Params
from benchlab.run import dist, power
from benchlab.run.data import TokenData, load_tokens
from benchlab.run.hardware import resolve_device
from benchlab.run.harness import process_age_s
from benchlab.run.runner import Measurement, train_once


def run_repeats(p: Params, name: str, data_dir: str, module_args: list[str]) -> list[Measurement]:
    """bench.repeats runs; in this process when there is one (DVC started it fresh), else one fresh process each.

    `module_args` run the stage's repeat mode (`python -m <module_args> --record-to FILE`); `data_dir` holds
    the tokens a run in this process reads.
    """
    runs: list[Measurement] = []
    settings = p.variants[name]
    place = f"variant {list(p.variants).index(name) + 1} of {len(p.variants)}"  # the matrix's progress
    deadline, walls = deadline_from_env(), []
    if deadline is not None and time.time() >= deadline:
        raise LabError(f"bench@{name}: BENCHLAB_DEADLINE passed before its first repeat; nothing recorded")
    for i in range(p.bench.repeats):
        if deadline is not None and walls and time.time() + min(walls) > deadline:
            print(f"bench@{name}: {i} of {p.bench.repeats} repeats: another would end past BENCHLAB_DEADLINE", flush=True)
            break
        label = f"bench@{name} ({place}) repeat {i + 1}/{p.bench.repeats}"
        began = time.perf_counter()
        if settings.parallel != "none":
            rec = repeat_in_fresh_process(module_args, nproc=settings.nproc)
        elif p.bench.repeats == 1:
            device = resolve_device(p.device)
            rec = train_variant(p, name, load_tokens(data_dir), device, label, keep_going=True)
        else:
            rec = repeat_in_fresh_process(module_args)
        runs.append(rec)
        walls.append(time.perf_counter() - began)
        print(f"{label}: {rec.status} {rec.message}".rstrip() + f" ({repeat_cost(rec, walls[-1])})", flush=True)
        if rec.status != "ok":
            break
    return runs


def deadline_from_env() -> float | None:
    """BENCHLAB_DEADLINE as a Unix time in seconds, or None when unset."""
    text = os.environ.get("BENCHLAB_DEADLINE", "").strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise LabError(f"BENCHLAB_DEADLINE={text!r} is not a Unix time in seconds; unset it or give one, "
                       "e.g. $(( $(date +%s) + 600 ))") from None


def repeat_cost(rec: Measurement, wall_s: float) -> str:
    """Where a repeat's wall time went: what a user plans a matrix's length by (start-up counts too).

    The part not named is the process's exit and the parent's reading of its record."""
    parts = [f"{wall_s:.1f} s"]
    for label, seconds in (("start-up and build", rec.setup_s), ("warm-up and compile", rec.warmup_s),
                           ("timed", None if rec.window_wall_ms is None else rec.window_wall_ms / 1000),
                           ("evaluation", rec.eval_s), ("exit", rec.exit_s)):
        if seconds is not None:
            parts.append(f"{label} {seconds:.1f} s")
            if label == "start-up and build":
                within = [f"{what} {t:.1f} s" for what, t in (("interpreter, imports and device", rec.startup_s),
                                                                ("the model's seeded init", rec.init_s),
                                                                ("the knobs applied", rec.apply_s)) if t is not None]
                parts[-1] += f" (of which {', '.join(within)})" if within else ""
    return ", ".join(parts)


@contextmanager
def rank_device(p: Params, name: str) -> Iterator[torch.device]:
    """The device this process runs variant `name` on. Under torchrun, its rank's (cuda:LOCAL_RANK on a GPU),
    joined to the process group with the variant's NCCL settings for the block and leaving it after."""
    device = resolve_device(p.device)
    if dist.launched():
        device = dist.init(device, p.variants[name].nccl_max_ctas)
    try:
        yield device
    finally:
        dist.teardown()


def train_variant(p: Params, name: str, data: TokenData, device: torch.device, label: str, steps: int | None = None,
                  on_step: Callable[[], None] | None = None, keep_going: bool = False) -> Measurement:
    """One run of variant `name` as bench times it: `steps` (default bench.steps), the first harness.warmup_steps
    untimed; the progress bar, labelled `label`, on the first rank only; `on_step` after every step."""
    return train_once(p, p.variants[name], data, device, p.bench.steps if steps is None else steps,
                      p.harness.warmup_steps, progress=label if dist.rank() == 0 else None, on_step=on_step,
                      keep_going=keep_going)


def one_repeat(p: Params, name: str, data_dir: str, record_to: Path) -> None:
    """Repeat mode: one run of the variant, its record written for the parent stage to read.

    Under torchrun this is one rank: it joins the process group, trains on its slice, and the ranks'
    records are gathered; only the first rank of each node writes the combined record.
    """
    with rank_device(p, name) as device:
        before = process_age_s()  # interpreter, imports, process group, CUDA context: what a fresh process pays
        rec = train_variant(p, name, load_tokens(data_dir), device, f"bench@{name}", keep_going=True)
        if before is not None and rec.setup_s is not None:
            rec.setup_s += before
            rec.startup_s = before
        rec = combine_ranks(dist.gather(rec))
    if dist.writes_record():
        record_to.write_text(rec.to_json())


def end_process() -> None:
    """A stage's process, or a repeat's, ends as soon as its outputs are written. The interpreter's own teardown
    (inductor's compile workers, the CUDA context) only kept the parent, or DVC, waiting: 1.5 to 2 s per repeat on
    a 2-core CPU, 2 to 7 s on an H200 (the `exit` part of each repeat's line). The outputs are written and closed,
    the process group destroyed; only the standard streams are still buffered (and, in a test, the params read)."""
    param_reads.write()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def combine_ranks(records: list[Measurement]) -> Measurement:
    """One run's record from its ranks' (rank order): the slowest rank's time per step, the mean loss per step,
    the highest memory peaks; rank 0's validation loss (every rank evaluates the same batches)."""
    first = records[0]
    failed = next((r for r in records if r.status != "ok"), None)
    if failed is not None:
        return failed
    out = Measurement(**{f.name: getattr(first, f.name) for f in fields(Measurement) if f.name != "run"})
    out.world_size = len(records)
    out.step_ms = [max(times) for times in zip(*(r.step_ms for r in records))]
    out.losses = [float(np.mean(values)) for values in zip(*(r.losses for r in records))]
    out.first_step_ms = out.step_ms[0] if out.step_ms else None
    gaps = [r.gap_ms for r in records]
    out.gap_ms = [max(g) for g in zip(*gaps)] if all(g is not None for g in gaps) else None  # type: ignore[call-overload]
    for key in ("warmup_s", "window_wall_ms", "mem_growth_mb"):
        values = [getattr(r, key) for r in records if getattr(r, key) is not None]
        setattr(out, key, max(values) if values else None)
    out.memory = {k: max((r.memory[k] for r in records if r.memory.get(k) is not None), default=None)
                  for k in first.memory}
    out.rank_peak_mb = [r.peaks.compared() or 0.0 for r in records]
    energy = power.combine([power.PowerReading(r.power_w, r.energy_j, r.power_note) for r in records])
    out.power_w, out.energy_j, out.power_note = energy.power_w, energy.energy_j, energy.note
    out.neighbours = _ranks_neighbours([r.neighbours for r in records])
    return out


def _ranks_neighbours(facts: list[dict]) -> dict:
    """One job's neighbours from its ranks': a rank's partners are not neighbours. Their PIDs leave the
    other-GPU-process list, and their own CPU share leaves each rank's "others" (the windows coincide:
    every rank times the same steps)."""
    if not all(facts):
        return facts[0]
    ranks = {f.get("pid") for f in facts}
    gpu = [f["other_gpu_processes"] for f in facts if f.get("other_gpu_processes") is not None]
    ours = sum(f["cpu_busy_ours_pct"] for f in facts)
    return {
        "pid": facts[0].get("pid"),
        "other_gpu_processes": sorted({pid for seen in gpu for pid in seen} - ranks) if gpu else None,
        "cpu_busy_pct": max(f["cpu_busy_pct"] for f in facts),
        "cpu_busy_ours_pct": ours,
        "cpu_busy_others_pct": max(max(0.0, f["cpu_busy_others_pct"] - (ours - f["cpu_busy_ours_pct"])) for f in facts),
    }


def _child(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a child of this stage (a repeat, torchrun) that dies with it; its stdout passes through, its stderr
    is kept for `last_words`."""
    return subprocess.run(cmd, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=parent_watch.die_with_parent)


def repeat_in_fresh_process(module_args: list[str], nproc: int | None = None) -> Measurement:
    """Run one repeat as `python -m <module_args> --record-to FILE` in a new process and read back its Measurement.

    With `nproc`, torchrun starts the module on that many ranks per node (`dist.torchrun_argv`) and the
    first rank of this node writes the ranks' combined record. The child is the same stage in its repeat
    mode; a failure there (a LabError, a crash, a stop) fails this stage with the child's last words,
    and so does any rank's death under torchrun: its partners' timings would be of a broken job.
    """
    with tempfile.TemporaryDirectory(prefix="benchlab-repeat-") as tmp:
        out = Path(tmp) / "record.json"
        cmd = dist.torchrun_argv(nproc, module_args) if nproc else [sys.executable, "-m", *module_args]
        proc = _child([*cmd, "--record-to", str(out)], env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if proc.returncode == 0 and out.is_file():
            rec = Measurement.from_json(out.read_text())
            rec.exit_s = max(0.0, time.time() - out.stat().st_mtime)  # the child's teardown after it wrote
            return rec
        sys.stderr.write(proc.stderr)
        last = last_words(proc.stderr)
        if nproc:
            raise LabError(f"the {nproc}-rank torchrun job failed (exit {proc.returncode}): {last}; nothing recorded")
        if proc.returncode in (2, 130, 143):  # the user's error or a stop: this stage cannot go on either
            raise LabError(f"a repeat's process failed (exit {proc.returncode}): {last}")
        # A crash (a CUDA fault, a killed compiler worker) is this variant's result; the matrix goes on.
        return Measurement(status="error", message=f"the repeat's process died (exit {proc.returncode}): {last[:300]}")


def on_ranks(nproc: int, module_args: list[str]) -> None:
    """Run `python -m <module_args>` on `nproc` ranks per node under torchrun, its ranks writing the stage's
    outputs themselves; a failed rank fails this stage."""
    proc = _child(dist.torchrun_argv(nproc, module_args))
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise LabError(f"the {nproc}-rank torchrun job failed (exit {proc.returncode}): {last_words(proc.stderr)}")


def last_words(stderr: str) -> str:
    """The line that says why a child failed: a stage's own `error:` line, else torchrun's note of the first
    rank that failed (its partners were stopped because of it), else a stop, else the last line."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    if errors:
        return errors[0].removeprefix("error: ")
    root = next((i for i, line in enumerate(lines) if line.startswith("Root Cause")), 0)
    fields_ = {}
    for line in lines[root:]:  # torchrun's summary: "rank : 1 (local_rank: 1)", "exitcode : -9 (pid: 7)", ...
        key, _, value = line.partition(":")
        if key.strip() in ("rank", "exitcode", "traceback") and key.strip() not in fields_:
            fields_[key.strip()] = value.strip()
    if "rank" in fields_ and "exitcode" in fields_:
        words = f"rank {fields_['rank']} ended with exit code {fields_['exitcode']}"
        signal_name = fields_.get("traceback", "")
        return words + (f" ({signal_name})" if signal_name.startswith("Signal") else "")
    stops = [line for line in lines if line.startswith("stopped ")]
    if stops:
        return stops[0].removesuffix("; nothing recorded")
    return lines[-1] if lines else "no message"
