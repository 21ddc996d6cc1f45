"""The one place a stage's process turns a LabError, a stop or an exhausted machine into one line and an exit
code, and removes what the stage wrote; and where its compiled graphs are kept."""

import os
import sys
from collections.abc import Callable
from pathlib import Path

from benchlab.core import files, locks, parent_watch
from benchlab.core.errors import LabError, exhausted

# inductor's and Triton's caches for every stage and each process it starts (a repeat, torchrun's ranks, the
# search's runs), in the project (ignored by git and DVC): a graph one stage compiled, the next stage that builds it
# loads (parity@recipe, bench@recipe and profile@recipe build one), and a fresh clone starts from an empty cache of
# its own, not from whatever torch's default folder (the system's temp folder) holds from other checkouts.
COMPILE_CACHE = Path(__file__).resolve().parents[2] / ".cache" / "inductor"


def use_compile_cache() -> None:
    """Point inductor and Triton at COMPILE_CACHE, unless the environment already names a folder; the processes
    this one starts inherit it. Before the first compilation."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(COMPILE_CACHE))
    os.environ.setdefault("TRITON_CACHE_DIR", str(COMPILE_CACHE / "triton"))


def run_main(main: Callable[[list[str] | None], None], argv: list[str] | None = None) -> None:
    """Run a stage's main; a LabError, a stop or an exhausted machine prints one line, removes what the stage
    wrote and exits non-zero.

    Exit codes: 2 for a LabError or an exhausted resource, 130 for Ctrl-C, 143 for SIGTERM or a dead parent.
    """
    files.forget_outputs()
    use_compile_cache()
    try:
        parent_watch.start(files.discard_outputs)
        with locks.one_dvc_run():
            main(argv)
        parent_watch.finish()
    except LabError as err:
        files.discard_outputs()
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except (KeyboardInterrupt, parent_watch.Stopped) as err:
        files.discard_outputs()
        print(parent_watch.stop_line("interrupted" if isinstance(err, KeyboardInterrupt) else str(err)), file=sys.stderr)
        code = 130 if isinstance(err, KeyboardInterrupt) else 143
        if parent_watch.signalled():
            # Stopped from outside: end now. The interpreter's teardown (torch's and the thread pools' exit
            # hooks) took up to 3 s on a busy 2-core CPU, and a signal landing in it printed a traceback.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        sys.exit(code)
    except BaseException as err:
        files.discard_outputs()
        why = exhausted(err)
        if why is None:
            raise
        print(f"error: {why}; nothing recorded", file=sys.stderr)
        sys.exit(2)
