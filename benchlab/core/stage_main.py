"""The one place a stage's process turns a LabError, a stop or an exhausted machine into one line and an exit
code, and removes what the stage wrote; and where its compiled graphs are kept."""

import glob
import importlib.metadata
import os
import platform
import re
import sys
from collections.abc import Callable
from pathlib import Path

from benchlab.core import files, locks, parent_watch
from benchlab.core.errors import LabError, exhausted

# inductor's and Triton's caches for every stage and each process it starts (a repeat, torchrun's ranks, the
# search's runs), in the project (ignored by git and DVC): a graph one stage compiled, the next stage that builds it
# loads (parity@recipe, bench@recipe and profile@recipe build one), and a fresh clone starts from an empty cache of
# its own, not from whatever torch's default folder (the system's temp folder) holds from other checkouts. One
# folder below it per torch, Triton and GPU (`machine_key`): a search resumed on another machine or after an
# upgrade starts a cache of its own, and the old one stays for when it comes back.
COMPILE_CACHE = Path(__file__).resolve().parents[2] / ".cache" / "inductor"


def machine_key() -> str:
    """torch's and Triton's versions and the GPUs' models (the driver's /proc files: no CUDA start-up), as a folder
    name; the CPU's architecture where there is no NVIDIA GPU."""
    def version(package: str) -> str:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return "none"
    models = set()
    for info in glob.glob("/proc/driver/nvidia/gpus/*/information"):
        text = Path(info).read_text(errors="replace")
        models |= {m.strip() for m in re.findall(r"^Model:\s*(.+)$", text, re.MULTILINE)}
    gpus = "+".join(sorted(models)) or f"cpu-{platform.machine()}"
    key = f"torch-{version('torch')}_triton-{version('triton')}_{gpus}"
    return re.sub(r"[^A-Za-z0-9.+_-]+", "-", key)


def compile_cache() -> Path:
    """This machine's folder of the project's compile cache."""
    return COMPILE_CACHE / machine_key()


def use_compile_cache() -> None:
    """Point inductor and Triton at this machine's compile cache, unless the environment already names a folder;
    the processes this one starts inherit it. Before the first compilation."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(compile_cache()))
    os.environ.setdefault("TRITON_CACHE_DIR", str(compile_cache() / "triton"))


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
