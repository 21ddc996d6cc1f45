"""The errors a user can fix, and the one place that turns them and stops into an exit code."""

import errno
import os
import sys
from collections.abc import Callable

from benchlab import io, lifeline


class LabError(Exception):
    """A problem with the user's params, data or files; the message says how to fix it."""


def run_main(main: Callable[[list[str] | None], None], argv: list[str] | None = None) -> None:
    """Run a stage's main; a LabError, a stop or an exhausted machine prints one line, removes what the stage
    wrote and exits non-zero.

    Exit codes: 2 for a LabError or an exhausted resource, 130 for Ctrl-C, 143 for SIGTERM or a dead parent.
    """
    io.forget_outputs()
    try:
        lifeline.start()
        main(argv)
        lifeline.finish()
    except LabError as err:
        io.discard_outputs()
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except (KeyboardInterrupt, lifeline.Stopped) as err:
        io.discard_outputs()
        at = f" at {lifeline.where()}" if lifeline.where() else " before its first step"
        why = "by the user" if isinstance(err, KeyboardInterrupt) or str(err) == "terminated" else f"because {err}"
        print(f"stopped {why}{at}; nothing recorded", file=sys.stderr)
        code = 130 if isinstance(err, KeyboardInterrupt) else 143
        if lifeline.signalled():
            # Stopped from outside: end now. The interpreter's teardown (torch's and the thread pools' exit
            # hooks) took up to 3 s on a busy 2-core CPU, and a signal landing in it printed a traceback.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        sys.exit(code)
    except BaseException as err:
        io.discard_outputs()
        why = exhausted(err)
        if why is None:
            raise
        print(f"error: {why}; nothing recorded", file=sys.stderr)
        sys.exit(2)


# What each exhausted resource is called, and how to give the stage more of it.
EXHAUSTED = {
    errno.ENOMEM: "out of memory: raise the memory limit (ulimit -v) or free memory",
    errno.EMFILE: "too many open files: raise the limit (ulimit -n)",
    errno.ENFILE: "the system ran out of file handles: close other programs or raise fs.file-max",
    errno.ENOSPC: "the disk is full: free space",
    errno.EDQUOT: "the disk quota is used up: free space",
    errno.EFBIG: "a file reached the file-size limit: raise it (ulimit -f)",
    errno.EAGAIN: "could not start a thread: out of memory or processes (ulimit -v, ulimit -u)",
}


def exhausted(err: BaseException) -> str | None:
    """One line for a failure that is the machine running out of something, not a bug; None for anything else.

    Under a memory limit Python raises MemoryError, `threading` RuntimeError("can't start new thread"), and the
    tokenizers library a pyo3 PanicException whose text holds the OS error."""
    text = (str(err).strip().splitlines() or [""])[0][:200]
    if isinstance(err, MemoryError):
        return EXHAUSTED[errno.ENOMEM] + (f" (MemoryError: {text})" if text else "")
    if isinstance(err, OSError) and err.errno in EXHAUSTED:
        return EXHAUSTED[err.errno] + (f" ({err.filename})" if err.filename else "")
    if isinstance(err, RuntimeError) and "can't start new thread" in text:
        return EXHAUSTED[errno.EAGAIN]
    if type(err).__name__ == "PanicException":  # pyo3's, raised by the tokenizers library
        if "memory allocation" in text:
            return f"{EXHAUSTED[errno.ENOMEM]} (tokenizers: {text})"
        for code, why in EXHAUSTED.items():
            if f"code: {code}," in text:
                return f"{why} (tokenizers: {text})"
    return None
