"""Measure the streaming `prepare`: wall time, peak memory, determinism, encoding throughput.

    python scripts/bench_prepare.py corpus /tmp/bench/c1g.txt 1000000000   # build a corpus
    python scripts/bench_prepare.py run /tmp/bench/c1g.txt /tmp/bench/out1  # one prepare, in a child
    python scripts/bench_prepare.py throughput /tmp/bench/c100m.txt /tmp/bench/out1 [bytes]  # tokens/s

The corpus is real text already on the machine: the .py, .txt, .rst and .md
files of this Python's standard library (test suite included) and of the
virtual environment's site-packages (torch, numpy, dvc, ...), those that are
UTF-8 without NUL bytes, concatenated in sorted path order and repeated until
the size is reached. Each result is one flat JSON line on stdout.
"""

import json
import os
import subprocess
import sys
import sysconfig
import time
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # benchlab, when run as a script
SOURCES = [Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])]
SUFFIXES = {".py", ".txt", ".rst", ".md"}


def source_files() -> list[Path]:
    return sorted(p for root in SOURCES for p in root.rglob("*") if p.suffix in SUFFIXES and p.is_file())


def build_corpus(out: Path, size: int) -> dict:
    """Concatenate the source texts, cycling through them, until `size` bytes (cut at a line end)."""
    texts = [raw for raw in map(Path.read_bytes, source_files()) if raw and b"\x00" not in raw and _utf8(raw)]
    out.parent.mkdir(parents=True, exist_ok=True)
    written, rounds = 0, 0
    with out.open("wb") as f:
        while written < size:
            rounds += 1
            for raw in texts:
                if written + len(raw) > size:
                    raw = raw[: raw.rfind(b"\n", 0, size - written) + 1]
                f.write(raw)
                written += len(raw)
                if written >= size or not raw:
                    break
            if not raw:
                break
    return {"corpus": str(out), "corpus_bytes": written, "source_files": len(texts), "source_bytes": sum(map(len, texts)),
            "rounds": rounds}


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


CHILD = """
import sys, time
from benchlab.core.sections import DataParams
from benchlab.prep.corpus import prepare
t = time.perf_counter()
meta = prepare(DataParams(corpus=sys.argv[1]), sys.argv[2])
print(time.perf_counter() - t, meta["train_tokens"] + meta["val_tokens"], meta["train_sha256"], meta["val_sha256"],
      meta["tokenizer_sha256"], meta["dtype"])
"""


def run_prepare(corpus: Path, out: Path) -> dict:
    """One prepare in a fresh child process: its wall time and peak resident memory (wait4's ru_maxrss)."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(corpus), str(out)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    start = time.perf_counter()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    seconds, tokens, train_sha, val_sha, tok_sha, dtype = proc.stdout.read().split()
    return {
        "corpus_bytes": corpus.stat().st_size, "exit_status": status, "wall_s": round(wall, 1),
        "prepare_s": round(float(seconds), 1), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "tokens": int(tokens), "train_sha256": train_sha, "val_sha256": val_sha, "tokenizer_sha256": tok_sha,
        "dtype": dtype, "cpu_user_s": round(usage.ru_utime, 1), "cpu_sys_s": round(usage.ru_stime, 1),
    }


def _pieces(corpus: Path, limit: int) -> list[str]:
    from benchlab.core.sections import DataParams
    from benchlab.prep.formats import corpus_pieces

    pieces, size = [], 0
    for piece in corpus_pieces([corpus], DataParams(corpus=str(corpus)), 256 * 1024):
        pieces.append(piece.text)
        size += len(piece.text.encode())
        if size >= limit:
            break
    return pieces


def _encode_worker(args: tuple[str, list[str]]) -> int:
    from tokenizers import Tokenizer

    tok = _WORKER_TOK.setdefault("tok", Tokenizer.from_file(args[0]))
    return sum(len(e.ids) for e in tok.encode_batch_fast(args[1], add_special_tokens=False))


_WORKER_TOK: dict = {}


def throughput(corpus: Path, prepared: Path, limit: int = 32_000_000) -> dict:
    """Tokens/s on the first `limit` bytes: the library alone (ceiling) against prepare's encode path."""
    import numpy as np
    from tokenizers import Tokenizer

    from benchlab.prep.corpus import encode_stream
    from benchlab.prep.formats import Piece

    tok_path = str(prepared / "tokenizer.json")
    tok = Tokenizer.from_file(tok_path)
    tok.encode_special_tokens = True
    pieces = _pieces(corpus, limit)
    size = sum(len(p.encode()) for p in pieces)
    threads = int(os.environ.get("RAYON_NUM_THREADS", os.cpu_count() or 1))

    start = time.perf_counter()
    tokens = sum(len(e.ids) for i in range(0, len(pieces), 16) for e in tok.encode_batch_fast(pieces[i : i + 16], add_special_tokens=False))
    ceiling = time.perf_counter() - start

    start = time.perf_counter()
    ours = sum(len(a) for a, _ in encode_stream(tok, (Piece(p, False, 0) for p in pieces), 0, np.dtype(np.uint16), 4 << 20))
    pipeline = time.perf_counter() - start

    # The alternative: processes, each with one Rust thread, fed the same batches.
    start = time.perf_counter()
    with get_context("spawn").Pool(threads) as pool:
        jobs = [(tok_path, pieces[i : i + 16]) for i in range(0, len(pieces), 16)]
        by_processes = sum(pool.imap(_encode_worker, jobs))
    processes = time.perf_counter() - start
    assert ours == tokens
    return {
        "text_bytes": size, "tokens": tokens, "threads": threads,
        "library_tokens_per_sec": round(tokens / ceiling), "prepare_tokens_per_sec": round(tokens / pipeline),
        "processes_tokens_per_sec": round(by_processes / processes),
        "library_mb_per_sec": round(size / ceiling / 1e6, 2), "prepare_mb_per_sec": round(size / pipeline / 1e6, 2),
    }


def main() -> None:
    cmd, *args = sys.argv[1:]
    if cmd == "corpus":
        result = build_corpus(Path(args[0]), int(args[1]))
    elif cmd == "run":
        result = run_prepare(Path(args[0]), Path(args[1]))
    elif cmd == "throughput":
        result = throughput(Path(args[0]), Path(args[1]), *map(int, args[2:3]))
    else:
        raise SystemExit(__doc__)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
