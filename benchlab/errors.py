"""The errors a user can fix, and the one place that turns them and stops into an exit code."""

import sys
from collections.abc import Callable

from benchlab import io, lifeline


class LabError(Exception):
    """A problem with the user's params, data or files; the message says how to fix it."""


def run_main(main: Callable[[list[str] | None], None], argv: list[str] | None = None) -> None:
    """Run a stage's main; a LabError or a stop prints one line, removes the stage's outputs and exits non-zero.

    Exit codes: 2 for a LabError, 130 for Ctrl-C, 143 for SIGTERM or a dead parent.
    """
    lifeline.start()
    io.forget_outputs()
    try:
        main(argv)
    except LabError as err:
        io.discard_outputs()
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except (KeyboardInterrupt, lifeline.Stopped) as err:
        io.discard_outputs()
        at = f" at {lifeline.where()}" if lifeline.where() else " before its first step"
        why = "by the user" if isinstance(err, KeyboardInterrupt) or str(err) == "terminated" else f"({err})"
        print(f"stopped {why}{at}; nothing recorded", file=sys.stderr)
        sys.exit(130 if isinstance(err, KeyboardInterrupt) else 143)
    except BaseException:
        io.discard_outputs()
        raise
