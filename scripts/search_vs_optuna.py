"""Our search against an Optuna multi-objective study on the scripted machines of benchlab/search/landscapes.py:
families of landscapes with interacting knobs, a large model's profile and measurement noise (issue 49;
docs/search-vs-optuna.md has the method and the figures).

    python scripts/search_vs_optuna.py                                  # every family, 3 landscapes, 5 Optuna seeds
    python scripts/search_vs_optuna.py --families large --landscapes 1 --seeds 2 --json figures.json

Each landscape's known front is found by brute force: every configuration of the searched knobs that the knobs'
rules allow, the points no other beats on both tokens/s and memory, among those at `lean_floor` of the start's
speed or more (the question the search answers). A run is one measured configuration; a refused one costs none,
and neither side measures a configuration twice (each keeps a journal). On a noisy landscape both sides see noisy
speeds, and what each has found is scored on the true figures of the configurations it measured.

The score is the share of the known front's hypervolume that the measured configurations cover (the area they
dominate between lean's floor and the start's memory), after 50 runs and after `--max-runs`.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchlab.search import pareto  # noqa: E402
from benchlab.search.journal import SCREENING, Journal  # noqa: E402
from benchlab.search.landscapes import BATCH, CONTEXT, FAMILIES, RECIPE, RULES, Landscape, Machine, family  # noqa: E402
from benchlab.search.moves import Candidate, Problem, space  # noqa: E402
from benchlab.search.strategy import Limits, Search  # noqa: E402

LEAN_FLOOR = 0.85
EARLY = 50  # the runs at which the first target is read
Point = tuple[float, float]  # (tokens/s, peak MiB)


def as_candidate(values: dict[str, Any]) -> Candidate:
    """A configuration as its changes to the recipe."""
    return Candidate(tuple((k, v) for k, v in values.items() if getattr(RECIPE, k) != v))


@functools.cache
def allowed() -> tuple[Candidate, ...]:
    """Every configuration of the space that the rules allow (the same rules for every landscape)."""
    knobs = space(BATCH)
    out = []
    for combo in itertools.product(*knobs.values()):
        cand = as_candidate(dict(zip(knobs, combo)))
        if RULES(cand.settings(RECIPE)) is None:
            out.append(cand)
    return tuple(out)


@dataclass(frozen=True)
class Scored:
    """A landscape with its known front: the frame every searcher's points are scored in."""

    landscape: Landscape

    @property
    def floor(self) -> float:
        return LEAN_FLOOR * self.landscape.start_tps

    def point(self, changes: dict[str, Any]) -> Point:
        tps, mem = self.landscape.figures(changes)
        return round(tps, 3), round(mem, 3)

    @functools.cached_property
    def front(self) -> dict[Point, str]:
        """The known front by brute force, each point with the fewest-change configuration that gives it."""
        named: dict[Point, str] = {}
        for cand in sorted(allowed(), key=lambda c: len(c.changes)):
            named.setdefault(self.point(dict(cand.changes)), cand.name)
        points = pareto.front(list(named), lambda p: p, self.floor)
        return {p: named[p] for p in points}

    def hypervolume(self, points: list[Point]) -> float:
        return pareto.area(pareto.front(points, lambda p: p, self.floor), self.floor, self.landscape.start_mb)

    def share(self, points: list[Point]) -> float:
        return self.hypervolume(points) / self.hypervolume(list(self.front))


@dataclass
class Trace:
    """What one searcher measured, in order: each run's true point."""

    name: str
    points: list[Point]
    seconds: float = 0.0

    def runs_to_cover(self, front: set[Point]) -> int | None:
        """Runs made when the last point of the front was first measured; None if it never was."""
        left = set(front)
        for i, p in enumerate(self.points, 1):
            left.discard(p)
            if not left:
                return i
        return None


def ours(scored: Scored, max_runs: int, folder: Path, seed: int = 0) -> Trace:
    """Our search with the landscape's fakes, from the recipe, without warm starts; its screening runs in order."""
    began = time.perf_counter()
    machine = Machine(scored.landscape)
    journal = Journal(folder / f"ours-{scored.landscape.name}-{seed}.jsonl", CONTEXT)
    limits = Limits(budget_s=1e9, max_candidates=max_runs, confirm=2, repeats=2, lean_floor=LEAN_FLOOR, seed=seed)
    Search(Problem(RECIPE, RULES, BATCH), machine, journal, limits, log=lambda _: None).run()
    runs = [r for r in journal.runs.values() if r.phase in SCREENING and r.status == "ok"]
    return Trace("ours", [scored.point(r.changes) for r in runs], time.perf_counter() - began)


def optuna_study(scored: Scored, seed: int, max_runs: int, storage_path: Path, sampler_name: str = "tpe") -> Trace:
    """An Optuna multi-objective study (tokens/s up, memory down) with each searched knob a categorical parameter,
    the recipe enqueued first, refused configurations pruned, lean's floor a constraint; it stops after `max_runs`
    measured configurations. Journal storage: a study stopped part way resumes from its file."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    began = time.perf_counter()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    knobs = space(BATCH)
    sampler = (optuna.samplers.NSGAIISampler(seed=seed, population_size=20) if sampler_name == "nsga2" else
               optuna.samplers.TPESampler(seed=seed, multivariate=True))
    storage = JournalStorage(JournalFileBackend(str(storage_path)))
    study = optuna.create_study(study_name=f"{sampler_name}-{seed}", storage=storage, sampler=sampler,
                                directions=["maximize", "minimize"], load_if_exists=True)
    if not study.trials:
        study.enqueue_trial({k: getattr(RECIPE, k) for k in knobs})
    seen: dict[str, Point] = {t.user_attrs["name"]: (t.values[0], t.values[1]) for t in study.trials
                              if t.state == optuna.trial.TrialState.COMPLETE}
    order = [t.user_attrs["changes"] for t in study.trials if t.user_attrs.get("new")]

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        cand = as_candidate({k: trial.suggest_categorical(k, list(v)) for k, v in knobs.items()})
        trial.set_user_attr("name", cand.name)
        if RULES(cand.settings(RECIPE)) is not None:
            raise optuna.TrialPruned()  # refused by the knobs' rules: no run
        p = seen.get(cand.name)
        if p is None:  # a configuration measured before costs no second run
            p = seen[cand.name] = scored.landscape.measured(dict(cand.changes), "screen")
            order.append(dict(cand.changes))
            trial.set_user_attr("new", True)
            trial.set_user_attr("changes", dict(cand.changes))
        trial.set_constraint("lean_floor", scored.floor - p[0])  # feasible at the floor or above
        return p

    for _ in range(50 * max_runs):  # refusals and repeats cost no run; this bounds them
        if len(order) >= max_runs:
            break
        study.optimize(objective, n_trials=1)
    return Trace(f"{sampler_name} seed {seed}", [scored.point(c) for c in order], time.perf_counter() - began)


def row(scored: Scored, trace: Trace, max_runs: int) -> dict[str, Any]:
    return {"runs": len(trace.points), "share_at_early": scored.share(trace.points[:EARLY]),
            "share_at_max": scored.share(trace.points[:max_runs]),
            "runs_to_front": trace.runs_to_cover(set(scored.front)), "seconds": round(trace.seconds, 1)}


def compare(families: list[str], landscapes: int, seeds: int, max_runs: int, folder: Path,
            log: Any = print) -> dict[str, Any]:
    out: dict[str, Any] = {"early_runs": EARLY, "max_runs": max_runs, "allowed_configurations": len(allowed()),
                           "families": {}}
    try:
        import optuna
        out["optuna_version"] = optuna.__version__
    except ImportError:
        optuna = None
        out["optuna"] = "not installed: pip install -r requirements.txt"
    for name in families:
        rows = []
        for instance in range(1 if name == "separable" else landscapes):
            scored = Scored(family(name, instance))
            entry = {"landscape": scored.landscape.name, "front_points": len(scored.front),
                     "ours": row(scored, ours(scored, max_runs, folder), max_runs), "tpe": []}
            if optuna is not None:
                for seed in range(seeds):
                    trace = optuna_study(scored, seed, max_runs, folder / f"tpe-{scored.landscape.name}-{seed}.log")
                    entry["tpe"].append(row(scored, trace, max_runs))
            log(line(entry))
            rows.append(entry)
        out["families"][name] = {"landscapes": rows, **means(rows)}
    return out


def means(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """A family's means: ours over its landscapes, TPE over its landscapes and seeds."""
    tpe = [t for r in rows for t in r["tpe"]]
    mean = statistics.fmean
    return {"ours_share_at_early": mean(r["ours"]["share_at_early"] for r in rows),
            "ours_share_at_max": mean(r["ours"]["share_at_max"] for r in rows),
            "ours_min_share_at_early": min(r["ours"]["share_at_early"] for r in rows),
            "tpe_share_at_early": mean(t["share_at_early"] for t in tpe) if tpe else None,
            "tpe_share_at_max": mean(t["share_at_max"] for t in tpe) if tpe else None}


def line(entry: dict[str, Any]) -> str:
    o = entry["ours"]
    text = (f"{entry['landscape']:>16}: front {entry['front_points']:>2} points; ours {o['runs']} runs, "
            f"{o['share_at_early']:.1%} at {EARLY}, {o['share_at_max']:.1%} at the end "
            f"(whole front after {o['runs_to_front'] or 'never'}; {o['seconds']:.0f} s)")
    if entry["tpe"]:
        text += ("; TPE " + ", ".join(f"{t['share_at_early']:.1%}/{t['share_at_max']:.1%}" for t in entry["tpe"]) +
                 f" (whole front in {sum(1 for t in entry['tpe'] if t['runs_to_front'])}/{len(entry['tpe'])})")
    return text


def print_figures(out: dict[str, Any]) -> None:
    print(f"\nhypervolume share of the known front, means (ours over landscapes; TPE over landscapes and seeds); "
          f"{out['allowed_configurations']:,} allowed configurations")
    print(f"{'family':>13} | ours at {EARLY} | ours (min) at {EARLY} | TPE at {EARLY} | ours at {out['max_runs']} | "
          f"TPE at {out['max_runs']}")
    for name, fam in out["families"].items():
        tpe = [fam["tpe_share_at_early"], fam["tpe_share_at_max"]]
        print(f"{name:>13} | {fam['ours_share_at_early']:.1%} | {fam['ours_min_share_at_early']:.1%} | "
              f"{'' if tpe[0] is None else f'{tpe[0]:.1%}'} | {fam['ours_share_at_max']:.1%} | "
              f"{'' if tpe[1] is None else f'{tpe[1]:.1%}'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    ap.add_argument("--landscapes", type=int, default=3, help="landscapes per family (seeds 0, 1, ...)")
    ap.add_argument("--seeds", type=int, default=5, help="Optuna seeds per landscape")
    ap.add_argument("--max-runs", type=int, default=200, help="measured runs at most, each side")
    ap.add_argument("--folder", help="where the journals go (kept: a rerun resumes); default: a temporary folder")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    if args.folder:
        Path(args.folder).mkdir(parents=True, exist_ok=True)
        out = compare(args.families, args.landscapes, args.seeds, args.max_runs, Path(args.folder))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            out = compare(args.families, args.landscapes, args.seeds, args.max_runs, Path(tmp))
    print_figures(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
