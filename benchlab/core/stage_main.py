"""The one place a stage's process turns a LabError, a stop or an exhausted machine into one line and an exit
code, and removes what the stage wrote."""

import os
import sys
from collections.abc import Callable

from benchlab.core import files, locks, parent_watch
from benchlab.core.errors import LabError, exhausted


def run_main(main: Callable[[list[str] | None], None], argv: list[str] | None = None) -> None:
    """Run a stage's main; a LabError, a stop or an exhausted machine prints one line, removes what the stage
    wrote and exits non-zero.

    Exit codes: 2 for a LabError or an exhausted resource, 130 for Ctrl-C, 143 for SIGTERM or a dead parent.
    """
    files.forget_outputs()
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
