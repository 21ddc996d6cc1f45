"""The errors a user can fix, and the machine running out of something; `benchlab.core.stage_main.run_main` turns both
into one line and an exit code."""

import errno


class LabError(Exception):
    """A problem with the user's params, data or files; the message says how to fix it."""


SHOWN_CHARS = 80  # a value echoed in a message is cut to this many characters: a 1 MB param stays one short line


def cut(text: str, limit: int = SHOWN_CHARS) -> str:
    """`text`, or where longer than `limit` its first `limit` characters and its length: `bbbb... (1,000,000 chars)`."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} chars)"


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """`repr(value)` for a message, cut where long (`'bbbb'... (1,000,000 chars)` for a string, counting its
    characters). Every user value a message echoes goes through here or `cut`, so a megabyte path or name never
    fills the terminal."""
    if isinstance(value, str):
        return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value):,} chars)"
    return cut(repr(value), limit)


def check(ok: bool, key: str, value: object, valid: str) -> None:
    """Refuse a value, naming its key, the value (cut where long, `shown`) and what would be valid."""
    if not ok:
        raise LabError(f"{key}={shown(value)} is not valid; expected {valid}")


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

    Under a memory limit Python raises MemoryError, `threading` RuntimeError("can't start new thread"), an import
    of a native library ImportError("... failed to map segment from shared object"), and the tokenizers library a
    pyo3 PanicException whose text holds the OS error."""
    text = (str(err).strip().splitlines() or [""])[0][:200]
    if isinstance(err, MemoryError):
        return EXHAUSTED[errno.ENOMEM] + (f" (MemoryError: {text})" if text else "")
    if isinstance(err, OSError) and err.errno in EXHAUSTED:
        return EXHAUSTED[err.errno] + (f" ({err.filename})" if err.filename else "")
    if isinstance(err, ImportError) and "failed to map segment" in text:  # a native library's code under ulimit -v
        return f"{EXHAUSTED[errno.ENOMEM]} (ImportError: {text})"
    if isinstance(err, RuntimeError) and "can't start new thread" in text:
        return EXHAUSTED[errno.EAGAIN]
    if type(err).__name__ == "PanicException":  # pyo3's, raised by the tokenizers library
        if "memory allocation" in text:
            return f"{EXHAUSTED[errno.ENOMEM]} (tokenizers: {text})"
        for code, why in EXHAUSTED.items():
            if f"code: {code}," in text:
                return f"{why} (tokenizers: {text})"
    return None
