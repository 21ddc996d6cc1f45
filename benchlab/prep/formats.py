"""The corpus's files and their formats, read as pieces of document text: memory stays flat however large.

A corpus is a file or a folder of files of one format (`data.format`, or under `auto` each file's suffix):
plain text (a file is one document), JSON lines, gzip-compressed or not (each record's `data.text_field` is one
document), or parquet (each row's `data.text_field` column is one document, read a row batch at a time). Every
reader yields `Piece`s of at most about `piece_bytes`, refusing bytes that are not UTF-8 text with a message that
names the file and the offset.

Text is cut only at a newline with printable ASCII on both sides. The byte-level pre-tokenizer always ends a
pre-token before and after such a newline, so encoding the pieces one by one gives exactly the tokens of
encoding the whole document, and training on them gives the same tokenizer.

Before any file is read, the corpus is checked for files that are no regular files (devices, FIFOs, sockets,
broken links): DVC, which hashes the corpus by reading it, would hang on them.
"""

import gzip
import json
import os
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from benchlab.core.errors import LabError, cut, shown
from benchlab.core.sections import DataParams

LONGEST = 16  # pieces a piece may grow to while no safe cut is found
TEXT_SUFFIXES = {"text": (".txt",), "jsonl": (".jsonl", ".jsonl.gz"), "parquet": (".parquet",)}


class Piece(NamedTuple):
    """A run of corpus text; an end-of-text token follows it when `doc_end`."""

    text: str
    doc_end: bool
    done_bytes: int
    """Bytes of the corpus files consumed once this piece is read (for progress)."""


def file_format(path: Path, fmt: str) -> str:
    """The reader for one file: `fmt` itself, or under `auto` the file's suffix."""
    if fmt != "auto":
        return fmt
    for name, suffixes in TEXT_SUFFIXES.items():
        if path.name.endswith(suffixes) and name != "text":
            return name
    return "text"


# What stat calls each kind of file that is neither a regular file nor a folder.
SPECIAL = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
           (stat.S_ISSOCK, "a socket"))


def special_files(root: str | Path) -> Iterator[tuple[Path, str]]:
    """Each path under `root` (itself included) that is not a regular file or a folder, with what it is.

    Links are followed, as DVC follows them when it hashes the corpus; only metadata is read (stat), never a
    file's bytes, so a device or a FIFO is named here without being opened."""
    seen: set[tuple[int, int]] = set()
    todo = [Path(root)]
    while todo:
        path = todo.pop()
        try:
            st = path.stat()
        except FileNotFoundError:
            yield path, "a broken link"
            continue
        except OSError as err:  # a link loop (ELOOP), a folder we may not read
            yield path, f"unreadable ({err.strerror})"
            continue
        if stat.S_ISDIR(st.st_mode):
            if (st.st_dev, st.st_ino) in seen:  # a link back up the tree: DVC would loop, we need not
                continue
            seen.add((st.st_dev, st.st_ino))
            try:
                todo.extend(sorted((Path(e.path) for e in os.scandir(path)), reverse=True))
            except OSError as err:
                yield path, f"unreadable ({err.strerror})"
        elif not stat.S_ISREG(st.st_mode):
            yield path, next(kind for test, kind in SPECIAL if test(st.st_mode))


def on_disk(path: str | Path) -> Path:
    """`path` as the file system names it: the UTF-8 bytes of its text, whatever the locale. Under LC_ALL=C with
    Python's UTF-8 mode off, file names are encoded as ASCII, and a params.yaml path such as data/corpus/données.txt
    raised UnicodeEncodeError; its UTF-8 bytes, carried as Python carries undecodable names (surrogate escapes),
    name the file a UTF-8 terminal created. Elsewhere the path is unchanged."""
    text = os.fspath(path)
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        return Path(os.fsdecode(text.encode("utf-8", "surrogateescape")))
    return Path(text)


def check_regular(corpus: str | Path) -> None:
    """Refuse a corpus holding a device, a FIFO, a socket or a broken link, naming it and saying to remove it,
    and a path no file can have (a name longer than the system allows).

    DVC hashes data.corpus by reading every file under it: a link to /dev/zero or a FIFO in the folder hangs
    `dvc repro`, `dvc exp run` and `dvc status` for good. The check_corpus stage, which DVC runs before it hashes
    the corpus for prepare, and the env stage call this."""
    shown_as, corpus = corpus, on_disk(corpus)
    try:
        os.lstat(corpus)
    except FileNotFoundError:
        return  # nothing to hash: prepare says that it does not exist
    except OSError as err:  # ENAMETOOLONG, a folder on the way that may not be searched
        raise unusable(shown_as, err) from None
    found = list(special_files(corpus))
    if found:
        path, kind = found[0]
        link = f" (a link to {cut(os.readlink(path))})" if path.is_symlink() else ""
        more = f", and {len(found) - 1} more such" if len(found) > 1 else ""
        raise LabError(f"data.corpus={shown(str(shown_as))} holds {path}, {kind}{link}{more}: DVC would hang reading it "
                       f"while hashing the corpus; remove it (rm {path}) or point data.corpus at regular files only")


def unusable(path: str | Path, err: OSError, key: str = "data.corpus") -> LabError:
    """The one line for a path the system refuses to look up (ENAMETOOLONG and the like), instead of a traceback."""
    return LabError(f"{key}={shown(str(path))} is not a usable path: {err.strerror}; point {key} at an existing "
                    "file or folder")


def corpus_files(path: str | Path, fmt: str = "auto") -> list[Path]:
    """The corpus's files: the file itself, or a folder's files of the format, recursively, in sorted order."""
    check_regular(path)
    path = on_disk(path)
    if path.is_file():
        return [path]
    formats = list(TEXT_SUFFIXES) if fmt == "auto" else [fmt]
    suffixes = tuple(s for f in formats for s in TEXT_SUFFIXES[f])
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(suffixes))
        if not files:
            kinds = ", ".join(f"*{s}" for s in suffixes)
            raise LabError(f"data.corpus={shown(str(path))} is a folder with no {kinds} files; put UTF-8 text files in "
                           "it or set data.format")
        return files
    raise LabError(f"data.corpus={shown(str(path))} does not exist; point it at a UTF-8 text file or a folder of *.txt "
                   "files")


def _cut(buf: bytes, force: bool) -> int:
    """Where to end a piece of `buf`: after its last newline between printable ASCII; 0 if none and not `force`."""
    nl = buf.rfind(b"\n", 0, len(buf) - 1)
    while nl > 0:
        if 32 < buf[nl - 1] < 127 and 32 < buf[nl + 1] < 127:
            return nl + 1
        nl = buf.rfind(b"\n", 0, nl)
    if not force:
        return 0
    # No safe newline in LONGEST pieces (one huge line, say): cut before a UTF-8
    # lead byte. Tokens may then differ from whole-file encoding at this one
    # point, but they still decode to the same text.
    end = len(buf) - 1
    while end > 0 and 0x80 <= buf[end] < 0xC0:
        end -= 1
    return end if end > 0 else len(buf)


def _decode(raw: bytes, file: Path, offset: int) -> str:
    """UTF-8 text of `raw`, read at byte `offset` of `file`; binary or non-UTF-8 input is refused."""
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise LabError(f"{file} holds NUL bytes (first at byte {offset + nul}): it is binary, not text; "
                       f"data.corpus needs UTF-8 text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise LabError(f"{file} is not UTF-8 text ({err.reason} at byte {offset + err.start}); "
                       f"convert it or pick another data.corpus") from None


def text_pieces(file: Path, piece_bytes: int, done: int) -> Iterator[Piece]:
    """A text file in pieces of at most about `piece_bytes`; the file is one document."""
    offset, carry = 0, b""
    with file.open("rb") as f:
        while True:
            block = f.read(piece_bytes)
            buf = carry + block
            if not block:
                yield Piece(_decode(buf, file, offset), True, done + offset + len(buf))
                return
            end = _cut(buf, force=len(buf) >= LONGEST * piece_bytes)
            if end:  # else no safe place yet: read on, up to LONGEST pieces
                yield Piece(_decode(buf[:end], file, offset), False, done + offset + end)
            offset, carry = offset + end, buf[end:]


def split_document(text: str, piece_bytes: int, done: int) -> Iterator[Piece]:
    """One document (a JSON record, a parquet row) as pieces; long ones are cut as text files are."""
    if len(text) <= piece_bytes // 4:  # at most 4 bytes a character: it fits, skip the encode
        yield Piece(text, True, done)
        return
    raw = text.encode()
    while len(raw) > piece_bytes:
        longest = LONGEST * piece_bytes
        end = _cut(raw[:piece_bytes], False) or _cut(raw[:longest], force=len(raw) > longest) or len(raw)
        yield Piece(raw[:end].decode(), False, done)
        raw = raw[end:]
    yield Piece(raw.decode(), True, done)


def _document_text(value: object, field: str, where: str) -> str:
    if not isinstance(value, str):
        raise LabError(f"{where} has {field}={value!r:.40}, not a string; set data.text_field to the key that holds the text")
    if "\x00" in value:
        raise LabError(f"{where} holds NUL characters: it is binary, not text; data.corpus needs UTF-8 text")
    return value


def jsonl_pieces(file: Path, field: str, piece_bytes: int, done: int) -> Iterator[Piece]:
    """A JSON-lines file (gzip-compressed when it ends in .gz): each record's `field` is one document."""
    raw = file.open("rb")
    stream = gzip.open(raw) if file.name.endswith(".gz") else raw
    offset = 0
    try:
        for number, line in enumerate(stream, 1):
            where, start, offset = f"{file} line {number}", offset, offset + len(line)
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except UnicodeDecodeError as err:
                raise LabError(f"{file} is not UTF-8 text ({err.reason} at byte {start + err.start}, line {number}); "
                               f"convert it or pick another data.corpus") from None
            except json.JSONDecodeError as err:
                raise LabError(f"{where} is not JSON ({err.msg}); data.format=jsonl needs one JSON object a line") from None
            if not isinstance(record, dict) or field not in record:
                raise LabError(f"{where} has no {field!r} field; set data.text_field to the key that holds the text")
            yield from split_document(_document_text(record[field], field, where), piece_bytes, done + raw.tell())
    except (gzip.BadGzipFile, EOFError, OSError, zlib.error) as err:
        raise LabError(f"{file} cannot be read ({err}); re-download it, or decompress it by hand if it is gzip") from None
    finally:
        stream.close()
        raw.close()


def parquet_pieces(file: Path, field: str, piece_bytes: int, done: int) -> Iterator[Piece]:
    """A parquet file: each row's `field` column is one document, read a row batch at a time."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise LabError("data.format=parquet needs pyarrow; `pip install pyarrow` (requirements.txt pins it)") from None
    try:
        pf = pq.ParquetFile(file)
    except Exception as err:  # pyarrow raises its own ArrowInvalid family
        raise LabError(f"{file} is not a readable parquet file ({err}); re-download it or pick another data.corpus") from None
    if field not in pf.schema_arrow.names:
        raise LabError(f"{file} has no column {field!r}; set data.text_field to one of: {', '.join(pf.schema_arrow.names)}")
    rows, size, row = max(pf.metadata.num_rows, 1), file.stat().st_size, 0
    batches = pf.iter_batches(batch_size=1024, columns=[field])
    while True:
        try:  # the footer read fine, but a data page may still be damaged: pyarrow finds out as it decodes
            values = next(batches).column(0).to_pylist()
        except StopIteration:
            return
        except Exception as err:  # pyarrow's ArrowInvalid / OSError family, or text that is not UTF-8
            raise LabError(f"{file} has a damaged data page after row {row} ({str(err).splitlines()[0][:200]}); "
                           "re-download it or pick another data.corpus") from None
        for value in values:
            row += 1
            yield from split_document(_document_text(value, field, f"{file} row {row}"), piece_bytes,
                                      done + size * row // rows)


def corpus_pieces(files: list[Path], data: DataParams, piece_bytes: int) -> Iterator[Piece]:
    """Every file's pieces, in order; `done_bytes` counts the files' bytes on disk. data.text_field is read whatever
    the files are, as the prepare stage lists it: a folder may gain a JSON lines file."""
    done, field = 0, data.text_field
    for file in files:
        fmt = file_format(file, data.format)
        if fmt == "text":
            yield from text_pieces(file, piece_bytes, done)
        elif fmt == "jsonl":
            yield from jsonl_pieces(file, field, piece_bytes, done)
        else:
            yield from parquet_pieces(file, field, piece_bytes, done)
        done += file.stat().st_size
