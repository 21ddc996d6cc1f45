"""Prepared tokens back to training batches.

`benchlab.prep.corpus.prepare` writes flat token files (uint16, or uint32 for a
vocabulary above 65,536) plus a meta JSON. `load_tokens` memory-maps those
files and checks them against the meta (dtype, size, sha256, token range) so
a truncated or edited file is caught before any training.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from benchlab.core.errors import LabError
from benchlab.core.files import file_sha256

RERUN = "rerun `dvc repro prepare` (or `python -m stages.prepare`) to rebuild it"


@dataclass(frozen=True)
class TokenData:
    train: np.ndarray
    val: np.ndarray
    vocab_size: int
    meta: dict


def _load_split(folder: Path, name: str, meta: dict, vocab: int, dtype: np.dtype) -> np.ndarray:
    path = folder / f"{name}.bin"
    if not path.is_file():
        raise LabError(f"{path} is missing; {RERUN}")
    count, size = meta[f"{name}_tokens"], path.stat().st_size
    if size % dtype.itemsize:
        raise LabError(f"{path} has {size} bytes, not a whole number of {dtype.name} tokens "
                       f"({dtype.itemsize} bytes each): truncated or replaced; {RERUN}")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise LabError(f"{folder / 'meta.json'} gives {name}_tokens={count!r}, not a count of tokens; {RERUN}")
    if size != count * dtype.itemsize:
        raise LabError(f"{path} has {size} bytes but meta.json says {count * dtype.itemsize}: truncated or replaced; {RERUN}")
    if size == 0:  # numpy cannot map an empty file, and no window fits in one
        raise LabError(f"{path} holds no tokens: the corpus was too small or the file was emptied; {RERUN} "
                       "from a larger data.corpus")
    if file_sha256(path) != meta[f"{name}_sha256"]:
        raise LabError(f"{path} does not match the sha256 in meta.json: corrupted or edited; {RERUN}")
    arr = np.memmap(path, dtype=dtype, mode="r")
    if len(arr) and int(arr.max()) >= vocab:
        raise LabError(f"{path} holds token ids >= the vocabulary size {vocab}; {RERUN}")
    return arr


def load_tokens(folder: str | Path) -> TokenData:
    """Memory-map the prepared splits after checking them against meta.json."""
    folder = Path(folder)
    meta_path = folder / "meta.json"
    if not meta_path.is_file():
        raise LabError(f"{meta_path} is missing; {RERUN}")
    try:
        meta = json.loads(meta_path.read_text())
        vocab = int(meta["tokenizer_vocab_size"])
        dtype = np.dtype(meta["dtype"])
        meta["train_tokens"], meta["val_tokens"], meta["train_sha256"], meta["val_sha256"]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise LabError(f"{meta_path} is not a valid meta file ({err}); {RERUN}") from None
    # prepare stores uint16 while the ids fit, uint32 above (benchlab.prep.corpus.token_dtype)
    expected = np.dtype(np.uint16 if vocab <= 65536 else np.uint32)
    if dtype != expected:
        raise LabError(f"{meta_path} says dtype {dtype.name} but a vocabulary of {vocab} is stored as {expected.name}; {RERUN}")
    splits = {name: _load_split(folder, name, meta, vocab, dtype) for name in ("train", "val")}
    return TokenData(splits["train"], splits["val"], vocab, meta)


def check_fits(tokens: np.ndarray, block_size: int, split: str) -> None:
    """A window needs block_size + 1 tokens (inputs plus the shifted targets)."""
    if len(tokens) < block_size + 1:
        raise LabError(
            f"shape.block_size={block_size} is longer than the {split} split ({len(tokens)} tokens); "
            f"lower shape.block_size below {len(tokens)} or bring a larger data.corpus"
        )


def batch_at(tokens: np.ndarray, starts: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets for windows starting at `starts`: two (B, T) int64 tensors."""
    rows = [torch.from_numpy(tokens[s : s + block_size + 1].astype(np.int64)) for s in starts.tolist()]
    window = torch.stack(rows)  # (B, T+1)
    return window[:, :-1].contiguous(), window[:, 1:].contiguous()


class BatchStream:
    """Random training windows in an order fixed by the seed, the same on every device."""

    def __init__(self, tokens: np.ndarray, batch_size: int, block_size: int, seed: int) -> None:
        check_fits(tokens, block_size, "train")
        self.tokens, self.batch_size, self.block_size = tokens, batch_size, block_size
        self.gen = torch.Generator().manual_seed(seed)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        high = len(self.tokens) - self.block_size
        starts = torch.randint(0, high, (self.batch_size,), generator=self.gen)
        return batch_at(self.tokens, starts, self.block_size)


def eval_batches(tokens: np.ndarray, batches: int, batch_size: int, block_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed set of validation windows, evenly spaced over the split."""
    check_fits(tokens, block_size, "validation")
    n = batches * batch_size
    starts = torch.linspace(0, len(tokens) - block_size - 1, n).long()
    return [batch_at(tokens, starts[i : i + batch_size], block_size) for i in range(0, n, batch_size)]
