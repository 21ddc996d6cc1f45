"""Stage prepare: corpus -> tokenizer (trained or given), train/val token files, meta.json, streamed."""

import benchlab.core.parent_watch  # noqa: F401  first: arms the lifeline before torch loads (benchlab/core/parent_watch.py)

import argparse

from benchlab.core.params import load_params
from benchlab.prep.corpus import check_inputs, prepare
from benchlab.core.stage_main import run_main
from benchlab.core.files import aside, commit_outputs
from benchlab.core.locks import sole_writer


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out_dir", help="folder for train.bin, val.bin, tokenizer.json, meta.json")
    args = ap.parse_args(argv)
    p = load_params()
    check_inputs(p.data)  # a bad param or tokenizer, or a corpus file missing, stops here
    with sole_writer(args.out_dir, "prepare"):
        # Written whole beside the earlier output, which stays byte for byte until this one is complete: a corpus
        # found bad half way (a byte that is not UTF-8, a jsonl line that is not JSON) or a full disk leaves it.
        meta = prepare(p.data, aside(args.out_dir))
        commit_outputs()
    print(f"prepare: {meta['corpus_bytes']} bytes -> {meta['train_tokens']} train + {meta['val_tokens']} val tokens, "
          f"vocab {meta['tokenizer_vocab_size']} ({meta['dtype']}), corpus sha256 {meta['corpus_sha256'][:12]}")


if __name__ == "__main__":
    run_main(main)
