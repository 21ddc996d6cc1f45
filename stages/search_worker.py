"""The search stage's child processes, which benchlab/search/worker.py and runs.py start (never DVC):

- `--worker`: the screening worker, one candidate per line of stdin, one record per line of stdout;
- `--candidate FILE --record-to RECORD`: one fresh-process run of the changes in FILE (a confirmation; on a CPU, a
  screening run with `--steps`);
- `--precompile FILE`: the candidate in FILE compiled ahead on a one-layer model.

Each inherits the search's log of the libraries' messages (worker.LOG_ENV).
"""

import benchlab.core.parent_watch  # noqa: F401  first: arms the lifeline before torch loads (benchlab/core/parent_watch.py)

import argparse
import os
import sys
from pathlib import Path

from benchlab.core.params import load_params
from benchlab.core.stage_main import run_main
from benchlab.run import launch
from benchlab.search import worker


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("data_dir")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--worker", action="store_true", help="serve screening runs")
    mode.add_argument("--candidate", help="a fresh-process run of the changes in this file")
    mode.add_argument("--precompile", help="compile the candidate in this file ahead")
    ap.add_argument("--steps", type=int, help="a CPU's screening run: this many steps")
    ap.add_argument("--record-to", help="where a fresh-process run writes its record")
    args = ap.parse_args(argv)
    if os.environ.get(worker.LOG_ENV):
        worker.libraries_to_log(os.environ[worker.LOG_ENV])
    p = load_params()
    if args.worker:
        worker.serve(p, args.data_dir)
    elif args.precompile:
        worker.precompile_here(p, Path(args.precompile), args.data_dir)
    else:
        if not args.record_to:
            ap.error("--candidate needs --record-to")
        worker.screen_here(p, Path(args.candidate), args.data_dir, Path(args.record_to), args.steps)


if __name__ == "__main__":
    run_main(main)
    if "--record-to" in sys.argv:  # the fresh-process run succeeded (every failure exits inside run_main)
        launch.end_process()
