"""The chain of processes from a stage up to what started it, read from /proc: the stage, the shell DVC ran it in
(when one stays between them), and up to the stage that started this one (a repeat, a rank under torchrun:
STARTER). parent_watch arms the lifeline on it; a link whose parent changes means its starter died.
"""

import os

SHELLS = {"sh", "bash", "dash", "zsh", "fish", "ksh"}
# Set by an armed stage for every process it starts: the pid of the stage, which must stay among their ancestors.
STARTER = "BENCHLAB_STARTER_PID"
MAX_CHAIN = 16  # processes between a stage and the stage that started it (torchrun's agent is one)


def ppid_of(pid: int) -> int | None:
    """The parent of `pid`, None once `pid` is gone; OSError when /proc cannot be read now (no free file
    descriptor), which says nothing about the process."""
    if pid == os.getpid():
        return os.getppid()  # a system call: needs no file descriptor
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # Field 4, after the command name in parentheses (which may itself hold spaces).
    return int(text.rsplit(")", 1)[1].split()[1])


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _chain_to(starter: int) -> list[tuple[int, int | None]] | None:
    """(pid, its parent) from this process up to `starter`; None when `starter` is not among our ancestors."""
    pairs: list[tuple[int, int | None]] = []
    pid = os.getpid()
    while len(pairs) < MAX_CHAIN:
        parent = ppid_of(pid)
        if parent is None or parent <= 1:
            return None
        pairs.append((pid, parent))
        if parent == starter:
            return pairs
        pid = parent
    return None


def watched() -> list[tuple[int, int | None]]:
    """(pid, its parent now) for this process, for our parent when it is a shell, and up to the stage that
    started us when one did (STARTER); empty when that stage is no longer among our ancestors."""
    starter = os.environ.get(STARTER, "")
    if starter.isdigit() and int(starter) != os.getpid():
        try:
            return _chain_to(int(starter)) or []
        except (OSError, ValueError, IndexError):
            pass  # /proc unreadable: watch our parent as below
    me, parent = os.getpid(), os.getppid()
    pairs: list[tuple[int, int | None]] = [(me, parent)]
    if comm(parent) in SHELLS:
        try:
            pairs.append((parent, ppid_of(parent)))
        except (OSError, ValueError, IndexError):
            pass  # /proc unreadable: our own parent is still watched
    return pairs


def adopted(pairs: list[tuple[int, int | None]]) -> bool:
    """Whether the chain shows that a starter died before we looked: no chain up to the stage that started us,
    or a link whose parent is outside our process group and is either init or, for a stage DVC started (which
    stays in DVC's process group), any process: a subreaper (`systemd --user` on a desktop) took it in.
    A process leading its own group was put there by whoever started it, and shows nothing this way."""
    if not pairs:
        return True
    ours = os.getpgid(0)
    if ours == os.getpid():
        return False
    try:
        return any(parent and os.getpgid(parent) != ours and (parent == 1 or "DVC_STAGE" in os.environ)
                   for _, parent in pairs)
    except ProcessLookupError:
        return True  # a parent gone already
    except OSError:
        return False  # cannot tell: the watcher and the parent-death signal still look


def orphaned(pairs: list[tuple[int, int | None]]) -> bool:
    """Whether any watched process has a new parent: the one that started it died."""
    try:
        return any(ppid_of(pid) != ppid for pid, ppid in pairs)
    except (OSError, ValueError, IndexError):
        return False  # cannot tell now (out of file descriptors, say): the next look decides


def dvc_run(pairs: list[tuple[int, int | None]]) -> str:
    """The DVC process that started this stage as "pid:start time", which no later process given its pid shares:
    what tells one DVC run from the next. Empty where no DVC did (a stage run by hand or by a script)."""
    pid = pairs[-1][1] if pairs else None  # the process above the shell DVC ran
    if not pid:
        return ""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")[:3]  # dvc; python .../bin/dvc; python -m dvc
        with open(f"/proc/{pid}/stat") as f:
            started = f.read().rsplit(")", 1)[1].split()[19]  # field 22, counted after the name
    except (OSError, IndexError):
        return ""
    return f"{pid}:{started}" if any(os.path.basename(arg) == b"dvc" for arg in argv) else ""
