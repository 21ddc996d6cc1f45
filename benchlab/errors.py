"""The errors a user can fix, and the one place that turns them into an exit code."""

import sys
from collections.abc import Callable


class LabError(Exception):
    """A problem with the user's params, data or files; the message says how to fix it."""


def run_main(main: Callable[[list[str] | None], None], argv: list[str] | None = None) -> None:
    """Run a stage's main; a LabError prints one clear line and exits 2, no traceback."""
    try:
        main(argv)
    except LabError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
