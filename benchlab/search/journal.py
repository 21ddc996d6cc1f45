"""The search's journal: every run it made, one JSON line each, so a stopped search resumes and later searches
start from what earlier ones found.

Each line carries the context its run is valid for (`search_runs.context`: model, batch, steps, cap, device,
versions, code). A search reads its own context's runs; the other contexts' lines stay in the file, and their
answers (phase `found`) warm-start searches of other model sizes on the same device. A last line cut short by
a kill is dropped.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# The phases whose runs are screening runs (one short run each, on the screening worker).
SCREENING = ("warm", "moves", "fastest", "lean", "explore", "global")
# What makes two contexts the same machine: answers found on another device or software are not used.
SAME_MACHINE = ("device", "torch", "memory_cap_gib")


@dataclass
class Run:
    """One candidate's run, as the journal keeps it."""

    name: str
    changes: dict[str, Any]
    phase: str  # warm | moves | fastest | lean | explore | global (screening) | confirm | parity | found
    status: str  # ok | oom | diverged | error | refused (| passed, failed for parity)
    tokens_per_sec: float | None = None
    peak_mem_mb: float | None = None
    wall_s: float = 0.0
    message: str = ""
    passed: bool | None = None  # parity only
    extra: dict[str, Any] = field(default_factory=dict)  # where the wall time went; parity's gap


class Journal:
    """The runs of one search context, read from (and appended to) a file that may hold other contexts too."""

    def __init__(self, path: Path, context: dict[str, Any]) -> None:
        self.path, self.context = path, context
        self.runs: dict[tuple[str, str], Run] = {}
        self.others: list[tuple[dict[str, Any], Run]] = []
        kept = []
        for line in path.read_text().splitlines() if path.exists() else []:
            try:
                entry = json.loads(line)
                ctx = entry.pop("context")
                run = Run(**entry)
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # written when the process was killed, or not a journal line
            kept.append(line)
            if ctx == context:
                self.runs[(run.phase, run.name)] = run
            else:
                self.others.append((ctx, run))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(line + "\n" for line in kept))

    def get(self, phase: str, name: str) -> Run | None:
        return self.runs.get((phase, name))

    def screened(self, name: str) -> Run | None:
        """The candidate's screening run from any screening phase (the same measurement)."""
        return next((run for phase in SCREENING if (run := self.get(phase, name)) is not None), None)

    def add(self, run: Run) -> Run:
        with self.path.open("a") as f:
            f.write(json.dumps({"context": self.context, **asdict(run)}) + "\n")
            f.flush()
        self.runs[(run.phase, run.name)] = run
        return run

    def spent_s(self) -> float:
        """Wall time of every run this search made: screening, confirmation and parity."""
        return sum(r.wall_s for r in self.runs.values())

    def measured(self) -> int:
        return sum(1 for r in self.runs.values() if r.phase in SCREENING and r.status != "refused")

    def found_elsewhere(self) -> list[tuple[str, dict[str, Any]]]:
        """Answers of searches at other model sizes on this machine: (label, knob values), newest last."""
        here = {k: self.context.get(k) for k in SAME_MACHINE}
        return [(f"{run.name} ({ctx.get('model')})", run.changes) for ctx, run in self.others
                if run.phase == "found" and {k: ctx.get(k) for k in SAME_MACHINE} == here
                and ctx.get("model") != self.context.get("model")]
