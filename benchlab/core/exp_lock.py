"""A stage's entry in DVC's own experiments lock, so that a `dvc exp run` started in its workspace while it runs
is refused by DVC before it changes a file.

A `dvc exp run` without `--temp` or `--queue` writes its params.yaml into the workspace and runs its stages there,
and DVC lets go of its repo lock while a stage runs: a second one rewrote params.yaml under the first
(`-S precision=tf32` trained with bf16), and both failed. Each `dvc exp run`, `--temp` and `--queue` included,
first stashes the workspace (measured: params.yaml was git's, then empty, then the new params, then back, within
0.2 s), and before that asks DVC's experiments lock (.dvc/tmp/exps/rwlock) for "workspace". A stage holds that
entry under its pid, so each of them stops there, with DVC's "'workspace' is busy" and our `busy_line`. A `--temp`
run's stages work in a copy under .dvc/tmp/exps and hold the copy's entry, so `--temp` runs go side by side.

The stage takes the entry as its program starts (parent_watch.arm_early, about 0.15 s after DVC lets go of its lock)
and lets go when it ends. A `dvc exp run` that gets in all the same, between two stages, is caught by
locks.one_dvc_run's params checks; one started while the first sets up, before its first stage, is left to DVC
(it lets go of its lock then too). A killed stage's entry names a dead pid, which DVC drops at its next look.
Where no DVC is importable or no `.dvc` folder is found, nothing is held.
"""

import atexit
import contextlib
import re
import time
from pathlib import Path
from typing import Any

# How to run experiments side by side: each in a workspace of its own.
SIDE_BY_SIDE = "run experiments side by side with `dvc exp run --queue` (then `dvc queue start`) or `dvc exp run --temp`"
# Why a refused `dvc exp run` has to wait, and what to do instead.
WHY = (", and any `dvc exp run` started now (`--temp` too: each first stashes the workspace) would rewrite the "
       f"params.yaml it runs with: wait for it to end; {SIDE_BY_SIDE}")
# The path in DVC's experiments lock that every `dvc exp run` writes while it stashes the workspace.
WORKSPACE = "workspace"

_state: dict[str, Any] = {"held": None}
REAPED_S = 3.0  # how long a holder that was killed (a zombie, or gone) is given to be reaped before it counts


def _ended(pid: int) -> bool:
    """Whether the process is gone or a zombie: killed, its entry not yet dropped (DVC counts a zombie as running)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def busy_line(stage: str) -> str:
    """What DVC prints, after its "'workspace' is busy, it is being blocked by: (PID n):", to a refused run."""
    return f"stage {stage} is running in this workspace{WHY}"


def dvc_root(folder: Path) -> Path | None:
    """The DVC project `folder` is in, found as DVC finds it: the nearest folder holding `.dvc/`."""
    for candidate in (folder, *folder.parents):
        if (candidate / ".dvc").is_dir():
            return candidate
    return None


def _hardlink_lock(dvc_dir: Path) -> bool:
    """Whether the project's DVC guards its lock files with hardlinks (`core.hardlink_lock`): ours must match."""
    from dvc.config import Config
    from dvc.exceptions import DvcException

    try:
        return bool(Config(dvc_dir=str(dvc_dir))["core"].get("hardlink_lock", False))
    except (DvcException, OSError):  # an unreadable config: DVC itself will say what is wrong with it
        return False


def hold(stage: str) -> str | None:
    """Hold "workspace" in the experiments lock of the DVC project around the current folder, for this process.

    Returns None once held (or where nothing can be: no project, DVC not importable), else who holds it: a
    `dvc exp run` stashing the workspace now, or a stage of another run. Holding it again is a no-op."""
    if _state["held"] is not None:
        return None
    root = dvc_root(Path.cwd())
    if root is None:
        return None
    try:
        from dvc.exceptions import DvcException
        from dvc.fs import localfs
        from dvc.lock import LockError
        from dvc.rwlock import rwlock
    except ImportError:
        return None
    folder = root / ".dvc" / "tmp" / "exps"
    deadline = time.monotonic() + REAPED_S
    while True:
        entry = rwlock(str(folder), localfs, busy_line(stage), [], [WORKSPACE], _hardlink_lock(root / ".dvc"))
        try:
            folder.mkdir(parents=True, exist_ok=True)
            entry.__enter__()
            break
        except LockError as err:
            blockers = [line.strip().removesuffix(WHY) for line in str(err).splitlines()
                        if line.strip().startswith("(PID")]
            pids = [int(pid) for pid in re.findall(r"\(PID (\d+)\)", str(err))]
            if not (pids and all(_ended(pid) for pid in pids) and time.monotonic() < deadline):
                return "; ".join(blockers) or str(err)
            time.sleep(0.1)  # a stage killed a moment ago: once reaped, DVC drops its entry
        except (OSError, DvcException):  # an unwritable .dvc/tmp or a corrupt lock file: DVC will name it itself
            return None
    _state["held"] = entry
    atexit.register(release)  # a stage that ends before run_main (an import error) lets go too
    return None


def held() -> bool:
    """Whether this process holds "workspace"."""
    return _state["held"] is not None


def release() -> None:
    """Let go of "workspace", if this process holds it."""
    entry, _state["held"] = _state["held"], None
    if entry is None:
        return
    # Never fail a stage that has recorded its outputs: whatever keeps the entry (DVC's guard busy past its wait,
    # the file removed by hand) leaves our pid in it, which DVC drops once we have ended.
    with contextlib.suppress(Exception):
        entry.__exit__(None, None, None)
