"""Corpus to token files, streamed: memory stays flat however large the corpus.

`prepare` makes two passes over the corpus (its files read as pieces of at most `piece_bytes` by
`benchlab.prep.formats`):

1. scan: every piece is checked (UTF-8, no NUL bytes) and, when a tokenizer is
   trained, a sample of the pieces (or all of them) feeds the BPE trainer
   through an iterator. A bad byte anywhere stops the stage here, before any
   token is written.
2. encode: pieces are encoded in bounded batches by the `tokenizers` library
   (its Rust thread pool spreads a batch over the cores) and the tokens are
   appended to the output file as they come.

Pieces end only where the byte-level pre-tokenizer ends a pre-token anyway, so
encoding them one by one gives exactly the tokens of encoding the whole file.

The validation split is the last `val_fraction` of the token stream, as when
the whole corpus was encoded at once: deterministic, disjoint from training,
and independent of piece and batch sizes and of the number of threads.
"""

import hashlib
import math
import sys
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from benchlab.core.errors import LabError, cut, shown
from benchlab.core.files import atomic_path, disk_full, file_sha256, write_json
from benchlab.core.sections import DataParams
from benchlab.prep.formats import Piece, corpus_files, corpus_pieces, file_format, on_disk, unusable

PIECE_BYTES = 256 * 1024  # bounded reads; a batch of them keeps both Rust threads busy
BATCH_BYTES = 4 * 1024 * 1024  # text per encode call: ~1.4M tokens, ~100 MB of Encoding objects
UINT16_VOCAB = 65536  # ids 0..65535 fit uint16; larger vocabularies need uint32


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits in it, uint32 above."""
    return np.dtype(np.uint16 if vocab_size <= UINT16_VOCAB else np.uint32)


# ---------------------------------------------------------------- progress


class Progress:
    """One status line, rewritten in place on a terminal and every 30 s in a log."""

    def __init__(self, phase: str, total_bytes: int) -> None:
        self.phase, self.total, self.start, self.shown = phase, max(total_bytes, 1), time.perf_counter(), 0.0
        self.tty = sys.stderr.isatty()

    def update(self, done_bytes: int, tokens: int, final: bool = False) -> None:
        now = time.perf_counter()
        if not final and now - self.shown < (0.5 if self.tty else 30.0):
            return
        self.shown, elapsed = now, now - self.start
        rate = done_bytes / max(elapsed, 1e-9)
        left = (self.total - done_bytes) / rate if rate > 0 else 0.0
        line = (f"prepare {self.phase}: {done_bytes / 1e6:,.1f}/{self.total / 1e6:,.1f} MB, {tokens / 1e6:,.1f} M tokens, "
                f"{rate / 1e6:.2f} MB/s, {elapsed:.0f} s, {left:.0f} s left")
        end = "\n" if final or not self.tty else ""
        print(("\r" if self.tty else "") + line.ljust(100), end=end, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- tokenizer


def sample_stride(total_bytes: int, sample_bytes: int) -> int:
    """Train on every stride-th piece, so a sample of `sample_bytes` spans the whole corpus."""
    return 1 if sample_bytes <= 0 else max(1, math.ceil(total_bytes / sample_bytes))


def new_tokenizer(vocab_size: int, eot: str):
    """An untrained byte-level BPE: every byte string round-trips."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[eot],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    return tok, trainer


def scan(pieces: Iterable[Piece], progress: Progress, stride: int, limit: int) -> tuple[Iterator[str], dict]:
    """The training sample as an iterator, checking every piece on the way; `stats` fills as it is consumed."""
    stats = {"text_bytes": 0, "sample_bytes": 0, "documents": 0, "has_text": False}

    def sample() -> Iterator[str]:
        for i, piece in enumerate(pieces):
            size = len(piece.text.encode())
            stats["text_bytes"] += size
            stats["documents"] += piece.doc_end
            stats["has_text"] = stats["has_text"] or not piece.text.isspace() and piece.text != ""
            progress.update(piece.done_bytes, 0)
            if i % stride == 0 and (limit <= 0 or stats["sample_bytes"] < limit):
                stats["sample_bytes"] += size
                yield piece.text
    return sample(), stats


def sample_rule(data: DataParams, stride: int, stats: dict) -> str:
    """What the tokenizer learned from, in words, for meta.json."""
    if data.tokenizer:
        return "none: pretrained"
    if stats["sample_bytes"] == stats["text_bytes"]:
        return "whole corpus"
    return f"every {stride}th piece, up to data.tokenizer_sample_bytes={data.tokenizer_sample_bytes}"


def load_pretrained(path: str, eot: str):
    """A tokenizer saved by the `tokenizers` library (a `tokenizer.json`)."""
    from tokenizers import Tokenizer

    try:
        found = on_disk(path).is_file()
    except OSError as err:  # a name longer than the system allows
        raise unusable(path, err, "data.tokenizer") from None
    if not found:
        raise LabError(f"data.tokenizer={shown(path)} does not exist; point it at a tokenizer.json or set it to '' to "
                       "train one")
    try:
        tok = Tokenizer.from_file(path)  # the library takes the text and encodes it as UTF-8 itself
    except Exception as err:  # the library raises plain Exception on a bad file
        raise LabError(f"data.tokenizer={shown(path)} is not a tokenizers tokenizer.json ({cut(str(err), 200)}); "
                       f"save one with Tokenizer.save or set it to '' to train one") from None
    if tok.token_to_id(eot) is None:
        raise LabError(f"data.tokenizer={shown(path)} has no token {shown(eot)}; set data.eot_token to its end-of-text "
                       "token")
    return tok


def check_inputs(data: DataParams) -> list[Path]:
    """The corpus's files, with the pretrained tokenizer (if one is named) loaded once to check it: what `prepare`
    reads, refused before the stage removes the earlier output."""
    if data.tokenizer:
        load_pretrained(data.tokenizer, data.eot_token)
    return corpus_files(data.corpus, data.format)


# ---------------------------------------------------------------- encoding


def batches(pieces: Iterable[Piece], batch_bytes: int) -> Iterator[list[Piece]]:
    """Pieces grouped into lists of about `batch_bytes` characters."""
    batch, size = [], 0
    for piece in pieces:
        batch.append(piece)
        size += len(piece.text)
        if size >= batch_bytes:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def encode_stream(tok, pieces: Iterable[Piece], eot_id: int, dtype: np.dtype, batch_bytes: int) -> Iterator[tuple[np.ndarray, int]]:
    """Token arrays batch by batch, with the bytes done; the next batch is encoded while this one is written."""
    # Special tokens come only from document boundaries: a literal
    # "<|endoftext|>" in the text is encoded as the text it is (issue 8).
    tok.encode_special_tokens = True
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = None
        for batch in batches(pieces, batch_bytes):
            job = pool.submit(tok.encode_batch_fast, [p.text for p in batch], add_special_tokens=False)
            if pending is not None:
                yield _tokens(*pending, eot_id, dtype)
            pending = (batch, job)
        if pending is not None:
            yield _tokens(*pending, eot_id, dtype)


def _tokens(batch: list[Piece], job, eot_id: int, dtype: np.dtype) -> tuple[np.ndarray, int]:
    parts = []
    for piece, enc in zip(batch, job.result()):
        parts.append(np.asarray(enc.ids, dtype=dtype))
        if piece.doc_end:
            parts.append(np.asarray([eot_id], dtype=dtype))
    return np.concatenate(parts), batch[-1].done_bytes


def split_tail(all_path: Path, val_path: Path, val_tokens: int, itemsize: int) -> None:
    """Move the last `val_tokens` tokens of all_path into val_path; all_path keeps the rest."""
    size = all_path.stat().st_size
    cut = size - val_tokens * itemsize
    with all_path.open("r+b") as src, val_path.open("wb") as dst:
        src.seek(cut)
        for chunk in iter(lambda: src.read(1 << 22), b""):
            dst.write(chunk)
        src.truncate(cut)


# ---------------------------------------------------------------- the stage


def corpus_sha256(files: list[Path]) -> str:
    """sha256 over the files' bytes, in read order."""
    digest = hashlib.sha256()
    for file in files:
        with file.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def prepare(data: DataParams, out_dir: str | Path, piece_bytes: int = PIECE_BYTES,
            batch_bytes: int = BATCH_BYTES) -> dict:
    """Tokenize the corpus into out_dir/{train.bin,val.bin,tokenizer.json,meta.json}; returns the meta."""
    out = Path(out_dir)
    files = corpus_files(data.corpus, data.format)
    (out / "meta.json").unlink(missing_ok=True)  # old outputs stop counting as complete right away
    disk_bytes = sum(f.stat().st_size for f in files)

    progress = Progress("scan", disk_bytes)
    stride = 1 if data.tokenizer else sample_stride(disk_bytes, data.tokenizer_sample_bytes)
    sample, stats = scan(corpus_pieces(files, data, piece_bytes), progress, stride, data.tokenizer_sample_bytes)
    if data.tokenizer:
        tok = load_pretrained(data.tokenizer, data.eot_token)
        for _ in sample:  # check every byte before encoding any
            pass
    else:
        tok, trainer = new_tokenizer(data.vocab_size, data.eot_token)
        tok.train_from_iterator(sample, trainer=trainer)
    progress.update(disk_bytes, 0, final=True)
    if not stats["has_text"]:
        raise LabError(f"data.corpus={shown(data.corpus)} is empty; it needs text to train on")

    vocab, eot_id = tok.get_vocab_size(), tok.token_to_id(data.eot_token)
    dtype = token_dtype(vocab)
    progress = Progress("encode", disk_bytes)
    total = 0
    with atomic_path(out / "train.bin") as train_tmp, atomic_path(out / "val.bin") as val_tmp:
        with train_tmp.open("wb") as f:
            for tokens, done in encode_stream(tok, corpus_pieces(files, data, piece_bytes), eot_id, dtype, batch_bytes):
                try:
                    tokens.tofile(f)
                except OSError as err:  # numpy's says only "N requested and M written"
                    raise disk_full(out / "train.bin", err) from None
                total += len(tokens)
                progress.update(done, total)
        progress.update(disk_bytes, total, final=True)
        n_val = int(total * data.val_fraction)
        if n_val < 2 or total - n_val < 2:
            raise LabError(f"data.corpus gives only {total} tokens; too few to split, bring more text")
        split_tail(train_tmp, val_tmp, n_val, dtype.itemsize)
    with atomic_path(out / "tokenizer.json") as tmp:
        tok.encode_special_tokens = False  # saved as trained; readers choose how to treat special tokens
        # Written by Python, byte for byte what tok.save writes: the library takes a path only as UTF-8 text, which a
        # folder named under LC_ALL=C (its name's bytes carried as surrogate escapes) is not.
        tmp.write_text(tok.to_str(pretty=True), encoding="utf-8")

    meta: dict = {
        "corpus": str(data.corpus), "corpus_format": ",".join(sorted({file_format(f, data.format) for f in files})), "corpus_files": len(files),
        "corpus_sha256": corpus_sha256(files), "corpus_bytes": disk_bytes, "corpus_text_bytes": stats["text_bytes"],
        "corpus_documents": stats["documents"],
        "tokenizer": f"pretrained {data.tokenizer}" if data.tokenizer else "byte-level BPE (tokenizers)",
        "tokenizer_trained_on_bytes": 0 if data.tokenizer else stats["sample_bytes"],
        "tokenizer_sample": sample_rule(data, stride, stats),
        "tokenizer_sha256": file_sha256(out / "tokenizer.json"), "tokenizer_vocab_size": vocab,
        "eot_id": eot_id, "dtype": dtype.name, "val_rule": f"last {data.val_fraction} of the token stream",
    }
    for name in ("train", "val"):
        path = out / f"{name}.bin"
        meta[f"{name}_tokens"] = path.stat().st_size // dtype.itemsize
        meta[f"{name}_sha256"] = file_sha256(path)
    write_json(out / "meta.json", meta)  # last: its presence marks a complete prepare
    return meta
