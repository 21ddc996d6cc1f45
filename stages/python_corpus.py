"""Stage python_corpus: a corpus of python_corpus.bytes of text from this Python install's sources and documents
(benchlab/prep/python_corpus.py), as JSON lines, with a record of what it holds."""

import benchlab.core.parent_watch  # noqa: F401  first: arms the lifeline before torch loads (benchlab/core/parent_watch.py)

import argparse

from benchlab.core.files import claim_outputs, commit_outputs, write_json
from benchlab.core.params import load_params
from benchlab.core.stage_main import run_main
from benchlab.prep.python_corpus import generate


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("corpus", help="the JSON-lines file to write")
    ap.add_argument("record", help="what it holds, as JSON")
    args = ap.parse_args(argv)
    p = load_params()
    claim_outputs(args.corpus, args.record)
    out = generate(args.corpus, p.python_corpus.bytes, p.data.text_field)
    write_json(args.record, out)
    commit_outputs()
    print(f"python_corpus: {out['documents']} documents, {out['text_bytes']:,} bytes of text from Python "
          f"{out['python']}, sha256 {out['sha256'][:12]}")


if __name__ == "__main__":
    run_main(main)
