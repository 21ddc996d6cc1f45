"""Stage prepare: corpus -> tokenizer (trained or given), train/val token files, meta.json, streamed."""

import benchlab.core.parent_watch  # noqa: F401  first: arms the lifeline before torch loads (benchlab/core/parent_watch.py)

import argparse

from benchlab.core.params import load_params
from benchlab.prep.corpus import check_inputs, prepare
from benchlab.core.stage_main import run_main
from benchlab.core.files import remove_outputs
from benchlab.core.locks import sole_writer


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out_dir", help="folder for train.bin, val.bin, tokenizer.json, meta.json")
    args = ap.parse_args(argv)
    p = load_params()
    check_inputs(p.data)  # a bad param, corpus or tokenizer stops here, and the earlier output stays as it was
    with sole_writer(args.out_dir, "prepare"):
        remove_outputs(args.out_dir)
        meta = prepare(p.data, args.out_dir)  # on a failure run_main removes what it wrote, and the folder if empty
    print(f"prepare: {meta['corpus_bytes']} bytes -> {meta['train_tokens']} train + {meta['val_tokens']} val tokens, "
          f"vocab {meta['tokenizer_vocab_size']} ({meta['dtype']}), corpus sha256 {meta['corpus_sha256'][:12]}")


if __name__ == "__main__":
    run_main(main)
