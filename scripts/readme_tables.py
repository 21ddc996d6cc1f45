"""Write the README's generated tables from the code and the committed results; `--check` says when one is stale.

    python scripts/readme_tables.py            # rewrite every generated section of README.md in place
    python scripts/readme_tables.py --check    # exit 1, naming each section that differs from what it would write

A generated section sits between a start marker and its end marker, and is never edited by hand:

    <!-- generated:knobs -->                       the knob table, one row per field of RunSettings
    <!-- /generated:knobs -->
    <!-- generated:headline results/<folder> [variant ...] -->
    <!-- /generated:headline -->

A headline marker names one results folder (relative to the README) and, optionally, the variants to show (default:
every variant the folder has a record of, in its params.yaml order). The table is read from the folder's
`metrics/env.json`, `metrics/variants/*.json`, `metrics/parity/*.json` (when there are any) and `params.yaml`, and
links to the folder's own report, `report.md`. Nothing here knows which machine, run or study a folder holds.
"""

import argparse
import json
import re
import sys
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, get_args, get_type_hints

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchlab.analysis.folder_report import folder_params  # noqa: E402
from benchlab.core.knob_row import applied_at
from benchlab.core.knobs import RunSettings  # noqa: E402  (the knob table
from benchlab.core.params import AggregateParams  # noqa: E402  (the baselines' defaults
from benchlab.core.record import RESERVED, RSS, Memory, Result, ratio_reference  # noqa: E402

SECTION = re.compile(r"<!-- generated:(\w+)(.*?) -->\n(.*?)<!-- /generated:\1 -->", re.S)


# ---- the knob table -------------------------------------------------------------------------------------------

def knob_values(hint: Any) -> str:
    """A knob's choices as the table shows them: its Literal's values, true | false, or the type's name."""
    if hint is bool:
        return "`true` \\| `false`"
    choices = get_args(hint)
    if set(choices) == {int, type(None)}:
        return "integer or unset"
    if choices:
        return " \\| ".join(f"`{c}`" for c in choices if c is not type(None))
    return hint.__name__


def knob_default(value: Any) -> str:
    if value is MISSING:
        return "–"
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "unset"}[value]
    return str(value)


def math_mark(name: str, changes: bool | tuple) -> str:
    """What the doc cell opens with for a knob that changes the optimization (parity does not judge it; the
    time-to-loss track does): every value but the default, or the values named."""
    if changes is True:
        return "**changes the math** (time-to-loss track, not parity): "
    if changes:
        return f"**{' and '.join(f'{name}={v}' for v in changes)} changes the math** (time-to-loss track, not parity): "
    return ""


def knobs_table() -> str:
    """One row per field of RunSettings: values, default, what it does, where apply applies it (numbered by the
    place of its step in benchlab.core.knob_row.STEPS), where it is skipped."""
    hints = get_type_hints(RunSettings)
    rows = ["| knob | values | default | what it does | applied at | skipped where |",
            "| --- | --- | --- | --- | --- | --- |"]
    for f in fields(RunSettings):
        skip = f.metadata["skip"]
        where = " ".join((skip.__doc__ or "").split()) if skip else "runs everywhere"
        rows.append(f"| `{f.name}` | {knob_values(hints[f.name])} | `{knob_default(f.default)}` | "
                    f"{math_mark(f.name, f.metadata['changes_math'])}{f.metadata['doc']} | {applied_at(f)} | {where} |")
    return "\n".join(rows)


# ---- a headline table from one results folder ------------------------------------------------------------------

def read_json_dir(folder: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}


def baseline(params: dict) -> str:
    return (params.get("aggregate") or {}).get("baseline", AggregateParams().baseline)


def fallbacks(params: dict) -> list[str]:
    return (params.get("aggregate") or {}).get("fallback_baselines", AggregateParams().fallback_baselines)


def reference(params: dict, records: dict[str, dict]) -> str | None:
    """The variant ratios are taken against, as the aggregate stage chooses (benchlab.core.record.ratio_reference)."""
    results = [Result.of({**rec, "variant": name}) for name, rec in records.items()]
    return ratio_reference(results, baseline(params), fallbacks(params))


def memory_cell(rec: dict) -> str:
    """Peak memory in MiB, the figure the row is compared by (benchlab.core.record.Memory), named where it is not
    the allocated peak: reserved where CUDA graphs hide their pools, the resident set on a CPU."""
    memory = Memory.of(rec)
    figure = memory.compared()
    if figure is None:
        return "–"
    return f"{figure:,.0f}" + {RESERVED: " (reserved)", RSS: " (RSS)"}.get(memory.compared_key(), "")


def interval_cell(rec: dict) -> str:
    low, high = rec.get("tokens_per_sec_pi95_low"), rec.get("tokens_per_sec_pi95_high")
    if (rec.get("repeats") or 1) < 2 or low is None or high is None:
        return "–"
    return f"{low:,.0f} to {high:,.0f}"


def parity_cell(rec: dict | None) -> str:
    """The parity stage's verdict: yes or no with the gap to the reference's tail loss and the reference's own
    seed-to-seed gap beside it, or why there is none (the verdict's own words)."""
    if rec is None:
        return "–"
    if rec.get("learns_same") is None:
        return shorten(str(rec.get("verdict") or rec.get("status", "–")))
    return (f"{'yes' if rec['learns_same'] else 'no'}: {rec['gap_nats']:+.3f} nats "
            f"(the reference's seeds: {rec['noise_nats']:.3f})")


def shorten(text: str, width: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 3] + "..."


def status_text(rec: dict) -> str:
    message = shorten(str(rec.get("message") or ""))
    return f"{rec['status']}: {message}" if message else str(rec["status"])


def machine(env: dict) -> str:
    if env.get("gpu"):
        count = env.get("gpu_count") or 1
        return f"{env['gpu']}" + (f" x {count}" if count > 1 else "")
    return f"CPU: {env.get('cpu', 'unknown')}, {env.get('cpu_count', '?')} cores"


def caption(folder: str, env: dict, params: dict, records: dict[str, dict], ref: str | None) -> str:
    first = next((r for r in records.values() if r.get("status") == "ok"), next(iter(records.values())))
    # A folder from before params.yaml was grouped by stage holds the shape under train and the harness under bench.
    shape = params.get("shape") or params.get("train", {})
    bench = params.get("bench", {})
    harness = params.get("harness") or bench
    software = ", ".join(f"{label} {env[k]}" for k, label in (("torch", "torch"), ("cuda", "CUDA")) if env.get(k))
    repeats = max((r.get("repeats") or 1) for r in records.values())
    dates = sorted(str(r["provenance.date_utc"])[:10] for r in records.values() if r.get("provenance.date_utc"))
    cap = first.get("memory_cap_gib") or harness.get("memory_cap_gib")
    parts = [f"**{machine(env)}** ({software})", f"`{first.get('model', params.get('model'))}`",
             f"batch {shape.get('batch_size')} x {shape.get('block_size')} tokens (a variant's own batch where it "
             f"sets one)", f"{bench.get('steps')} steps of which {harness.get('warmup_steps')} warm-up",
             f"up to {repeats} fresh-process repeats per variant" if repeats > 1 else "one run per variant"]
    if cap:
        parts.append(f"GPU memory capped at {cap} GiB")
    if dates:
        parts.append(dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}")
    base = baseline(params)
    if ref is None:
        ratio = "No reference variant ran, so no ratios"
    elif ref != base:
        why = records.get(base, {}).get("status", "no record")
        ratio = f"`{base}` did not run ({why}), so ratios are against `{ref}`"
    else:
        ratio = f"Ratios against `{ref}`"
    return (", ".join(parts) + f". {ratio}; the whole run, with intervals, plots, profiles and skips: "
            f"[{folder}/report.md]({folder}/report.md).")


def load_run(run: Path) -> tuple[dict[str, dict], dict, dict, dict[str, dict]]:
    """A results folder's variant records, params, environment and parity records."""
    records = read_json_dir(run / "metrics/variants")
    if not records:
        raise SystemExit(f"{run}: no metrics/variants/*.json to make a headline table from")
    params = folder_params(run)  # as the run's stages saw them (its preset applied)
    env_file = run / "metrics/env.json"
    env = json.loads(env_file.read_text()) if env_file.is_file() else {
        k[4:]: v for r in records.values() for k, v in r.items() if k.startswith("env.")}
    return records, params, env, read_json_dir(run / "metrics/parity")


def row(rec: dict, base: float | None, yardstick: float | None, energy: bool, parity: dict | None) -> list[str]:
    """One variant's cells; `base` and `yardstick` are the tokens/s its ratios divide by (None: no column)."""
    ok = rec.get("status") == "ok"
    if ok:
        tps = rec["tokens_per_sec"]
        cells = [f"{tps:,.0f}", interval_cell(rec), f"{tps / base:.3f}x" if base else "–"]
        cells += [f"{tps / yardstick:.3f}x"] if yardstick else []
    else:
        cells = [status_text(rec), "–", "–"] + ["–"] * bool(yardstick)
    cells.append(memory_cell(rec) if ok or rec.get("status") == "oom" else "–")  # an oom: where it stopped
    if energy:
        tpj = rec.get("tokens_per_joule")
        cells.append(f"{tpj:,.0f}" if isinstance(tpj, (int, float)) else "not measured" if ok else "–")
    if parity is not None:
        cells.append(parity_cell(parity.get(rec.get("variant", ""))))
    return cells


def headline_table(readme_dir: Path, args: str) -> str:
    """The headline table of the results folder the marker names, for the variants it names (or all)."""
    folder, *wanted = args.split()
    records, params, env, parity = load_run(readme_dir / folder)
    missing = [v for v in wanted if v not in records]
    if missing:
        raise SystemExit(f"{folder}: no record of {', '.join(missing)} (it has {', '.join(records)})")
    listed = list(params.get("variants") or {})
    order = wanted or [v for v in listed if v in records] + sorted(v for v in records if v not in listed)
    ref = reference(params, records)
    # The first fallback (by default the public recipe, the yardstick our own variants must beat) gets a second
    # ratio column when it is not the reference itself.
    fallback = next(iter(fallbacks(params)), None)
    yardstick = fallback if fallback not in (None, ref) and records.get(fallback, {}).get("status") == "ok" else None
    energy = any(isinstance(records[v].get("tokens_per_joule"), (int, float)) for v in order)
    learns = any(v in parity for v in order)
    head = ["variant", "tokens/s", "next run 95%", f"vs `{ref}`" if ref else "vs reference"]
    head += [f"vs `{yardstick}`"] * bool(yardstick) + ["peak memory MiB"]
    head += ["tokens/J"] * energy + ["learns the same"] * learns
    rows = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    base = records[ref]["tokens_per_sec"] if ref else None
    yard = records[yardstick]["tokens_per_sec"] if yardstick else None
    for name in order:
        cells = row({**records[name], "variant": name}, base, yard, energy, parity if learns else None)
        rows.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return caption(folder, env, params, records, ref) + "\n\n" + "\n".join(rows)


# ---- the README's sections -------------------------------------------------------------------------------------

def generate(kind: str, args: str, readme_dir: Path) -> str:
    if kind == "knobs":
        return knobs_table()
    if kind == "headline":
        return headline_table(readme_dir, args)
    raise SystemExit(f"unknown generated section `{kind}`: knobs | headline")


def render(text: str, readme_dir: Path) -> tuple[str, list[str]]:
    """The README with every generated section rewritten, and the sections that changed."""
    stale: list[str] = []

    def fill(m: re.Match) -> str:
        kind, args = m.group(1), m.group(2).strip()
        body = generate(kind, args, readme_dir) + "\n"
        if body != m.group(3):
            stale.append(f"{kind} {args}".strip())
        return f"<!-- generated:{kind}{m.group(2)} -->\n{body}<!-- /generated:{kind} -->"

    return SECTION.sub(fill, text), stale


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if a generated section is out of date")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md", help="default: the repository's README.md")
    a = ap.parse_args()
    text = a.readme.read_text()
    new, stale = render(text, a.readme.resolve().parent)
    if a.check:
        for name in stale:
            print(f"{a.readme}: generated section `{name}` is out of date: run python scripts/readme_tables.py")
        raise SystemExit(1 if stale else 0)
    a.readme.write_text(new)
    print(f"{a.readme}: " + (f"rewrote {', '.join(stale)}" if stale else "up to date"))


if __name__ == "__main__":
    main()
