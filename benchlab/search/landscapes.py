"""Scripted machines: landscapes of tokens/s and peak memory over the searched knobs, on which the search is tested
(tests/unit/test_search*.py) and compared with Optuna (scripts/search_vs_optuna.py) without a device.

A landscape starts from the recipe's figures. Each change to the recipe multiplies the speed and adds to the
memory (`effects`; a change not listed costs 1% and no memory); sets of changes that do better or worse together
than apart multiply the speed once more (`together`); nothing fits under `floor_mb` (the weights). A noisy
landscape returns each measurement's speed with a relative error drawn from a normal law of sd `noise`, the same
for the same draw of the same configuration, so a search that is stopped and started again sees what it saw.

The families (each `family(name, seed)`):
- **separable**: the first machine (issue 44): one interacting pair, the rest independent. The easiest case
  for a search that moves one knob at a time.
- **interactions**: the same effects, with about 30% of the pairs of changes to two knobs doing up to 4% better
  or worse together than apart (drawn from the seed).
- **large**: a large model's profile: float8 pays, checkpointing costs more speed and saves far more memory,
  the optimizer's state is most of the memory, and the fastest basin (fp8=all with 8-bit Adam and
  max-autotune) is only good with all three, each worse alone; pairs interact by up to 2%.
- **noisy**: the separable machine measured with 1% noise on the speed.

The rules are the knobs' own on an H200 (`RULES`), so `optimizer=adamw_bf16_sr` alone is refused and needs
`weight_dtype=bf16`, as on the device.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from dataclasses import dataclass, field
from typing import Any

from benchlab.core.knobs import RunSettings
from benchlab.core.skips import DeviceFacts
from benchlab.search.journal import Entry
from benchlab.search.moves import Candidate, Change, rules_for, space

RECIPE = RunSettings(precision="bf16", attention="sdpa", compile=True, optimizer="adamw_fused")
BATCH = 16
H200 = DeviceFacts(kind="cuda", name="NVIDIA H200", capability=(9, 0), bf16=True, triton=True, torchao=True, liger=True,
                   liger_version="0.8.5", cce=True, gpu_count=1)
RULES = rules_for(H200, BATCH)
CONTEXT = {"model": "gpt2_124m", "batch_size": BATCH, "device": "NVIDIA H200", "torch": "2.11.0", "memory_cap_gib": None}
FAMILIES = ("separable", "interactions", "large", "noisy")

Effects = dict[Change, tuple[float, float]]  # a change: (speed multiplier, MiB added)

SEPARABLE: Effects = {
    ("precision", "fp32"): (0.30, 9000), ("precision", "tf32"): (0.45, 4000), ("precision", "fp16"): (0.98, 0),
    ("weight_dtype", "bf16"): (1.03, -2500), ("attention", "manual"): (0.70, 3000),
    ("activation_checkpointing", "full"): (0.80, -5000), ("activation_checkpointing", "selective"): (0.90, -3000),
    ("loss", "chunked"): (0.97, -2000), ("loss", "fused"): (1.00, -1800), ("loss", "onepass"): (1.06, -1500),
    ("fp8", "blocks"): (1.02, 0), ("optimizer", "adamw"): (0.97, 0), ("optimizer", "adamw_8bit"): (0.97, -1500),
    ("optimizer", "adamw_bf16_sr"): (1.02, -1000), ("compile", False): (0.50, 2000),
    ("compile_mode", "reduce-overhead"): (1.04, 500),
    ("grad_accum", 2): (0.95, -1500), ("grad_accum", 4): (0.90, -2500), ("grad_accum", 8): (0.80, -3000)}
SEPARABLE_TOGETHER = {frozenset({("loss", "onepass"), ("compile_mode", "reduce-overhead")}): 1.02}  # one graph

# GPT-2 1558M on one H200 in outline: 50 K tokens/s in 60 GiB, of which the weights, gradients and AdamW's two
# moments (16 bytes a parameter) are most; activations are the rest.
LARGE: Effects = {
    ("precision", "fp32"): (0.25, 30000), ("precision", "tf32"): (0.40, 15000), ("precision", "fp16"): (0.99, 0),
    ("weight_dtype", "bf16"): (1.02, -9000), ("attention", "manual"): (0.60, 20000),
    ("activation_checkpointing", "full"): (0.74, -24000), ("activation_checkpointing", "selective"): (0.84, -15000),
    ("loss", "chunked"): (0.99, -1500), ("loss", "fused"): (1.00, -1400), ("loss", "onepass"): (1.01, -1200),
    ("fp8", "blocks"): (1.07, -2000), ("fp8", "all"): (0.97, -2500), ("fp8", "head"): (1.00, 0),
    ("optimizer", "adamw"): (0.98, 0), ("optimizer", "adamw_8bit"): (0.98, -9000),
    ("optimizer", "adamw_bf16_sr"): (1.01, -3000), ("compile", False): (0.70, 15000),
    ("compile_mode", "reduce-overhead"): (1.00, 2000), ("compile_mode", "max-autotune"): (0.97, 0),
    ("grad_accum", 2): (0.97, -8000), ("grad_accum", 4): (0.95, -12000), ("grad_accum", 8): (0.92, -14000)}
LARGE_TOGETHER = {frozenset({("fp8", "all"), ("optimizer", "adamw_8bit"), ("compile_mode", "max-autotune")}): 1.18}


@dataclass(frozen=True)
class Landscape:
    """One scripted machine (see the module's docstring)."""

    name: str
    start_tps: float
    start_mb: float
    floor_mb: float
    effects: Effects
    together: dict[frozenset[Change], float]
    noise: float = 0.0
    unlisted: tuple[float, float] = (0.99, 0.0)

    def figures(self, changes: dict[str, Any]) -> tuple[float, float]:
        """The configuration's true tokens/s and peak MiB (its changes to the recipe)."""
        tps, mem = self.start_tps, self.start_mb
        for change in changes.items():
            speed, more = self.effects.get(change, self.unlisted)
            tps, mem = tps * speed, mem + more
        present = set(changes.items())
        for group, speed in self.together.items():
            tps *= speed if group <= present else 1.0
        return tps, max(mem, self.floor_mb)

    def measured(self, changes: dict[str, Any], draw: str = "") -> tuple[float, float]:
        """One measurement: the true figures, the speed with this draw's noise."""
        tps, mem = self.figures(changes)
        if not self.noise:
            return tps, mem
        key = f"{self.name}|{sorted(changes.items())}|{draw}".encode()
        rng = random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))
        return tps * (1 + self.noise * rng.gauss(0.0, 1.0)), mem


def _pairs(effects: Effects, share: float, size: float, rng: random.Random) -> dict[frozenset[Change], float]:
    """About `share` of the pairs of changes to two different knobs, each doing up to `size` better or worse
    together."""
    terms = sorted({*effects, *((k, v) for k, values in space(BATCH).items() for v in values
                                if getattr(RECIPE, k) != v)}, key=str)
    out = {}
    for a, b in itertools.combinations(terms, 2):
        if a[0] != b[0] and rng.random() < share:
            out[frozenset({a, b})] = 1.0 + rng.uniform(-size, size)
    return out


def family(name: str, seed: int = 0) -> Landscape:
    """The landscape of a family (FAMILIES) for a seed; `separable` has one landscape whatever the seed."""
    rng = random.Random(f"{name}-{seed}")
    if name == "separable":
        return Landscape("separable", 100_000.0, 10_000.0, 1_500.0, SEPARABLE, SEPARABLE_TOGETHER)
    if name == "interactions":
        return Landscape(f"interactions-{seed}", 100_000.0, 10_000.0, 1_500.0, SEPARABLE,
                         {**_pairs(SEPARABLE, 0.30, 0.04, rng), **SEPARABLE_TOGETHER})
    if name == "large":
        return Landscape(f"large-{seed}", 50_000.0, 60_000.0, 12_000.0, LARGE,
                         {**_pairs(LARGE, 0.30, 0.02, rng), **LARGE_TOGETHER})
    if name == "noisy":
        return Landscape(f"noisy-{seed}", 100_000.0, 10_000.0, 1_500.0, SEPARABLE, SEPARABLE_TOGETHER, noise=0.01)
    raise ValueError(f"family={name!r} is not valid; expected {', '.join(FAMILIES)}")


class Killed(Exception):
    """The scripted machine's kill: the process ends in the middle of a run."""


@dataclass
class Machine:
    """A protocol.Device on a landscape: screen, repeat, judge (it compiles nothing ahead); every call is counted as
    `kind:name`, and the call numbered `kill_at` (from 1) raises instead of running. A screening run's wall time is
    `screen_s` (`timed_s` of it timed steps), a fresh-process repeat's `repeat_s`, a verdict's `judge_s`. A
    screening run records the landscape's noise as its spread (`tps_spread`), as a device's run records its steps'
    spread."""

    landscape: Landscape = field(default_factory=lambda: family("separable"))
    kill_at: int | None = None
    fails_parity: tuple[str, ...] = ()
    screen_s: float = 10.0
    timed_s: float = 2.0
    repeat_s: float = 10.0
    judge_s: float = 8.0
    calls: list[str] = field(default_factory=list)

    def _call(self, kind: str, cand: Candidate) -> None:
        if self.kill_at is not None and len(self.calls) + 1 == self.kill_at:
            raise Killed(f"{kind}:{cand.name}")
        self.calls.append(f"{kind}:{cand.name}")

    def screen(self, cand: Candidate, settings: RunSettings) -> Entry:
        self._call("screen", cand)
        assert RULES(settings) is None, f"the search ran {cand.name}, which the rules refuse"
        tps, mem = self.landscape.measured(dict(cand.changes), "screen")
        extra = {"timed_s": self.timed_s, **({"tps_spread": self.landscape.noise} if self.landscape.noise else {})}
        return Entry(cand.name, {}, "", "ok", tokens_per_sec=tps, peak_mem_mb=mem, wall_s=self.screen_s, extra=extra)

    def repeat(self, cand: Candidate, settings: RunSettings) -> Entry:
        self._call("repeat", cand)
        tps, mem = self.landscape.measured(dict(cand.changes), f"repeat {len(self.calls)}")
        return Entry(cand.name, {}, "", "ok", tokens_per_sec=tps, peak_mem_mb=mem, wall_s=self.repeat_s)

    def judge(self, cand: Candidate, settings: RunSettings) -> Entry:
        self._call("judge", cand)
        passed = cand.name not in self.fails_parity
        return Entry(cand.name, {}, "", "ok", passed=passed, wall_s=self.judge_s,
                   message="learns the same" if passed else "0.3 nats worse")

    def prepare(self, batch: list[tuple[Candidate, RunSettings]]) -> Entry | None:
        return None

    def of(self, kind: str) -> list[str]:
        return [c.split(":", 1)[1] for c in self.calls if c.startswith(kind + ":")]

