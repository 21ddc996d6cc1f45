"""Stage check_corpus: refuse a corpus that DVC would hang on, before DVC reads it for prepare.

DVC hashes a stage's deps when it comes to that stage. Naming a stage (`dvc repro prepare`, `train`, `evaluate`)
runs only what it depends on, so without this stage DVC read data.corpus for prepare before anything could refuse
a FIFO or a link to /dev/zero in it, and hung. Prepare depends on this stage's output, so DVC runs it first
whichever stage is named; it runs on every repro (always_changed), and its output never changes, so prepare does
not rerun because of it.
"""

import benchlab.core.parent_watch  # noqa: F401  first: arms the lifeline before torch loads (benchlab/core/parent_watch.py)

import argparse

from benchlab.core.params import corpus_param
from benchlab.core.stage_main import run_main
from benchlab.prep.formats import check_regular
from benchlab.core.files import claim_outputs, commit_outputs, write_json


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", help="what the check found; the same every time it passes")
    args = ap.parse_args(argv)
    claim_outputs(args.out)
    check_regular(corpus_param())
    write_json(args.out, {"corpus_special_files": 0})
    commit_outputs()


if __name__ == "__main__":
    run_main(main)
