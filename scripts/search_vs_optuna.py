"""Our search against an Optuna multi-objective study on the scripted machine of tests/test_search.py (issue 44,
item 5; docs/search-vs-optuna.md has the method and the figures).

    python scripts/search_vs_optuna.py                      # both, Optuna's samplers over five seeds
    python scripts/search_vs_optuna.py --seeds 3 --max-runs 150 --json figures.json

The machine is a table of knob effects on tokens/s and peak memory (one interacting pair, a memory floor) under
the knobs' own rules on an H200, so `optimizer=adamw_bf16_sr` alone is refused and needs `weight_dtype=bf16`.
Its known front is found by brute force: every allowed configuration of the searched knobs, the points no other
beats on both tokens/s and memory, among those at `lean_floor` of the start's speed or more (the question the
search answers: the fastest, and the leanest at that floor). A run is one measured configuration; a refused one
costs none, and a configuration measured once is never measured again (each side keeps a journal).

Optuna is not a requirement of the lab (ours finds the front in fewer runs, see the doc); without it the script says so and stops.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchlab.core.knobs import KNOBS  # noqa: E402
from benchlab.search.journal import SCREENING, Journal  # noqa: E402
from benchlab.search.moves import MICRO_BATCH_SPLITS, Candidate, choices, searched  # noqa: E402
from benchlab.search.strategy import Limits, Search  # noqa: E402
from tests.test_search import BATCH, CONTEXT, RECIPE, RULES, Machine, figures  # noqa: E402

LEAN_FLOOR = 0.85
Point = tuple[float, float]  # (tokens/s, peak MiB), rounded so equal figures compare equal


def space() -> dict[str, tuple[Any, ...]]:
    """Every searched knob's values: the space both sides search (grad_accum: 1 and the search's splits)."""
    return {k: (1, *MICRO_BATCH_SPLITS) if k == "grad_accum" else choices(k) for k in KNOBS if searched(k)}


def as_candidate(values: dict[str, Any]) -> Candidate:
    """A configuration as its changes to the recipe."""
    return Candidate(tuple((k, v) for k, v in values.items() if getattr(RECIPE, k) != v))


def point(changes: dict[str, Any]) -> Point:
    tps, mem = figures(changes)
    return round(tps, 3), round(mem, 3)


@functools.cache
def allowed() -> tuple[Candidate, ...]:
    """Every configuration of the space that the rules allow."""
    knobs = space()
    out = []
    for combo in itertools.product(*knobs.values()):
        cand = as_candidate(dict(zip(knobs, combo)))
        if RULES(cand.settings(RECIPE)) is None:
            out.append(cand)
    return tuple(out)


def front_of(points: set[Point], floor_tps: float) -> set[Point]:
    """The points at floor_tps or more that no other beats on both figures (more tokens/s, less memory)."""
    out, least_mem = set(), float("inf")
    for tps, mem in sorted((p for p in points if p[0] >= floor_tps), key=lambda p: (-p[0], p[1])):
        if mem < least_mem:
            out.add((tps, mem))
            least_mem = mem
    return out


def known_front() -> tuple[dict[Point, str], int]:
    """The machine's front by brute force (each point with the fewest-change configuration that gives it), and how
    many allowed configurations it was taken over."""
    cands = allowed()
    front = front_of({point(dict(c.changes)) for c in cands}, LEAN_FLOOR * figures({})[0])
    named: dict[Point, str] = {}
    for c in sorted(cands, key=lambda c: len(c.changes)):
        named.setdefault(point(dict(c.changes)), c.name)
    return {p: named[p] for p in sorted(front, reverse=True)}, len(cands)


@dataclass
class Trace:
    """What one searcher measured, in order: each run's point."""

    name: str
    points: list[Point]

    def runs_to_cover(self, front: set[Point]) -> int | None:
        """Runs made when the last point of the front was first measured; None if it never was."""
        left = set(front)
        for i, p in enumerate(self.points, 1):
            left.discard(p)
            if not left:
                return i
        return None

    def coverage(self, front: set[Point], runs: int) -> int:
        return len(front & set(self.points[:runs]))

    def hypervolume(self, runs: int) -> float:
        return hypervolume(set(self.points[:runs]))


def hypervolume(points: set[Point]) -> float:
    """The area (tokens/s x MiB) the points dominate between lean's floor and the start's memory: partial credit
    for a front found in part or nearly."""
    floor, top_mem = LEAN_FLOOR * figures({})[0], figures({})[1]
    area, least_mem = 0.0, top_mem
    for tps, mem in sorted(front_of(points, floor), key=lambda p: -p[0]):
        if mem < least_mem:
            area += (tps - floor) * (least_mem - mem)
            least_mem = mem
    return area


def ours(budget_runs: int, folder: Path) -> Trace:
    """Our search with the scripted machine's fakes; its screening runs (the measured candidates) in order."""
    machine = Machine()
    journal = Journal(folder / "ours.jsonl", CONTEXT)
    limits = Limits(budget_s=1e9, max_candidates=budget_runs, confirm=2, repeats=2, lean_floor=LEAN_FLOOR)
    Search(RECIPE, RULES, machine.screen, machine.repeat, machine.judge, journal, limits, BATCH,
           log=lambda _: None).run()
    runs = [r for r in journal.runs.values() if r.phase in SCREENING and r.status == "ok"]
    return Trace("ours", [point(r.changes) for r in runs])


def optuna_study(sampler_name: str, seed: int, max_runs: int, storage_path: Path) -> Trace:
    """An Optuna multi-objective study (tokens/s up, memory down) with each searched knob a categorical parameter,
    the recipe enqueued first, refused configurations pruned, lean's floor a constraint; it stops after
    `max_runs` measured configurations. Journal storage: a study stopped part way resumes from its file."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    knobs = space()
    floor = LEAN_FLOOR * figures({})[0]

    sampler = (optuna.samplers.NSGAIISampler(seed=seed, population_size=20) if sampler_name == "nsga2" else
               optuna.samplers.TPESampler(seed=seed, multivariate=True))
    storage = JournalStorage(JournalFileBackend(str(storage_path)))
    study = optuna.create_study(study_name=f"{sampler_name}-{seed}", storage=storage, sampler=sampler,
                                directions=["maximize", "minimize"], load_if_exists=True)
    if not study.trials:
        study.enqueue_trial({k: getattr(RECIPE, k) for k in knobs})
    measured: dict[str, Point] = {t.user_attrs["name"]: (t.values[0], t.values[1]) for t in study.trials
                                  if t.state == optuna.trial.TrialState.COMPLETE}
    order = [t.user_attrs["name"] for t in study.trials if t.user_attrs.get("new")]

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        cand = as_candidate({k: trial.suggest_categorical(k, list(v)) for k, v in knobs.items()})
        trial.set_user_attr("name", cand.name)
        if RULES(cand.settings(RECIPE)) is not None:
            raise optuna.TrialPruned()  # refused by the knobs' rules: no run
        p = measured.get(cand.name)
        if p is None:  # a configuration measured before costs no second run
            p = measured[cand.name] = point(dict(cand.changes))
            order.append(cand.name)
            trial.set_user_attr("new", True)
        trial.set_constraint("lean_floor", floor - p[0])  # feasible at the floor or above
        return p

    for _ in range(50 * max_runs):  # refusals and repeats cost no run; this bounds them
        if len(order) >= max_runs:
            break
        study.optimize(objective, n_trials=1)
    return Trace(f"{sampler_name} seed {seed}", [measured[n] for n in order])


def compare(seeds: int, max_runs: int, folder: Path) -> dict[str, Any]:
    named, n_allowed = known_front()
    front = set(named)
    mine = ours(max_runs, folder)
    equal = len(mine.points)
    out: dict[str, Any] = {"allowed_configurations": n_allowed, "front_points": len(front),
                           "front": [[tps, mem, name] for (tps, mem), name in named.items()], "equal_runs": equal,
                           "ours": {"runs": equal, "runs_to_front": mine.runs_to_cover(front),
                                    "covered": mine.coverage(front, equal),
                                    "hypervolume_share": mine.hypervolume(equal) / hypervolume(front)}}
    try:
        import optuna
    except ImportError:
        out["optuna"] = "not installed: pip install optuna to compare (it is not one of the lab's requirements)"
        return out
    out["optuna_version"] = optuna.__version__
    for sampler in ("nsga2", "tpe"):
        rows = []
        for seed in range(seeds):
            trace = optuna_study(sampler, seed, max_runs, folder / f"optuna-{sampler}-{seed}.log")
            rows.append({"seed": seed, "runs": len(trace.points), "runs_to_front": trace.runs_to_cover(front),
                         "covered_at_equal_runs": trace.coverage(front, equal),
                         "covered_at_max_runs": trace.coverage(front, max_runs),
                         "hypervolume_share_at_equal_runs": trace.hypervolume(equal) / hypervolume(front),
                         "hypervolume_share_at_max_runs": trace.hypervolume(max_runs) / hypervolume(front)})
        out[sampler] = rows
    return out


def print_figures(out: dict[str, Any], max_runs: int) -> None:
    n = out["front_points"]
    print(f"the known front: {n} points over {out['allowed_configurations']:,} allowed configurations")
    for tps, mem, name in out["front"]:
        print(f"  {tps:>9,.0f} tokens/s {mem:>7,.0f} MiB  {name}")
    o = out["ours"]
    print(f"ours: {o['runs']} runs, {o['covered']}/{n} of the front, {o['hypervolume_share']:.1%} of its "
          "hypervolume; whole front after "
          f"{o['runs_to_front'] or 'never (within its runs)'}")
    if isinstance(out.get("optuna"), str):
        print(f"optuna: {out['optuna']}")
        return
    for sampler in ("nsga2", "tpe"):
        for row in out[sampler]:
            print(f"optuna {sampler} seed {row['seed']}: {row['covered_at_equal_runs']}/{n} "
                  f"({row['hypervolume_share_at_equal_runs']:.1%}) at {out['equal_runs']} runs, "
                  f"{row['covered_at_max_runs']}/{n} ({row['hypervolume_share_at_max_runs']:.1%}) at {max_runs}; whole front after "
                  f"{row['runs_to_front'] or f'more than {max_runs}'} runs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5, help="Optuna seeds per sampler")
    ap.add_argument("--max-runs", type=int, default=200, help="measured runs at most, each side")
    ap.add_argument("--folder", help="where the journals go (kept: a rerun resumes); default: a temporary folder")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    if args.folder:
        Path(args.folder).mkdir(parents=True, exist_ok=True)
        out = compare(args.seeds, args.max_runs, Path(args.folder))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            out = compare(args.seeds, args.max_runs, Path(tmp))
    print_figures(out, args.max_runs)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
