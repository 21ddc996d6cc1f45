"""Per-module mutation scores from mutmut's working folder (mutants/*.meta), as a markdown table.

Run after `mutmut run` (see docs/mutation.md). Killed share = killed / (total - no tests) and killed / total.
"""

import json
from collections import Counter
from pathlib import Path

from mutmut.stats import status_by_exit_code


def scores(root: Path = Path("mutants")) -> dict[str, Counter]:
    """Status counts of every mutated module, keyed by its path."""
    out = {}
    for meta in sorted(root.rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        out[str(meta.relative_to(root)).removesuffix(".meta")] = Counter(status_by_exit_code[c] for c in codes.values())
    return out


def main() -> None:
    print("| module | mutants | killed | survived | timeout | no tests | not checked | killed % |")
    print("|---|---|---|---|---|---|---|---|")
    total: Counter = Counter()
    for path, c in scores().items():
        total.update(c)
        row = [sum(c.values()), c["killed"], c["survived"], c["timeout"], c["no tests"], c["not checked"]]
        print(f"| {path} | " + " | ".join(map(str, row)) + f" | {100 * c['killed'] / max(1, row[0]):.1f} |")
    row = [sum(total.values()), total["killed"], total["survived"], total["timeout"], total["no tests"], total["not checked"]]
    print("| all | " + " | ".join(map(str, row)) + f" | {100 * total['killed'] / max(1, row[0]):.1f} |")


if __name__ == "__main__":
    main()
