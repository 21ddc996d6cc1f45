"""Per-module mutation scores as a markdown table: from mutmut's working folder (mutants/*.meta), or from a
committed verdict file (`--verdicts results/cpu-mutation/FILE.txt`, one `mutant: verdict` per line).

Run after `mutmut run` (see docs/mutation.md). Caught = killed + timed out (a mutant that hangs the tests is
caught too); caught % is of all the module's mutants.
"""

import argparse
import json
from collections import Counter
from pathlib import Path


def scores(root: Path = Path("mutants")) -> dict[str, Counter]:
    """Status counts of every mutated module, keyed by its path."""
    from mutmut.stats import status_by_exit_code  # mutmut is a tool to run by hand, not a test requirement

    out = {}
    for meta in sorted(root.rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        out[str(meta.relative_to(root)).removesuffix(".meta")] = Counter(status_by_exit_code[c] for c in codes.values())
    return out


def scores_from_verdicts(path: Path) -> dict[str, Counter]:
    """Status counts by module from a verdict file: `benchlab.analysis.summary.x_table__mutmut_3: killed` per line."""
    out: dict[str, Counter] = {}
    for line in path.read_text().splitlines():
        if line.startswith("#") or ": " not in line:
            continue
        name, verdict = line.rsplit(": ", 1)
        module = name.split(".x")[0].replace(".", "/") + ".py"
        out.setdefault(module, Counter())[verdict] += 1
    return dict(sorted(out.items()))


def table(counts: dict[str, Counter]) -> str:
    lines = ["| module | mutants | killed | timed out | survived | no tests | not checked | caught % |",
             "|---|---|---|---|---|---|---|---|"]
    total: Counter = Counter()
    for path, c in [*counts.items(), ("all", total)]:
        if path != "all":
            total.update(c)
        row = [sum(c.values()), c["killed"], c["timeout"], c["survived"], c["no tests"], c["not checked"]]
        lines.append(f"| {path} | " + " | ".join(map(str, row)) +
                     f" | {100 * (c['killed'] + c['timeout']) / max(1, row[0]):.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--verdicts", type=Path, help="a committed verdict file instead of mutants/")
    args = ap.parse_args()
    print(table(scores_from_verdicts(args.verdicts) if args.verdicts else scores()))


if __name__ == "__main__":
    main()
