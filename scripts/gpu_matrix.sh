#!/usr/bin/env bash
# Run the whole pipeline at GPT-2 124M scale on a CUDA machine, through DVC,
# in a scratch copy of this repository, and pack what it measured.
#
#   scripts/gpu_matrix.sh OUT_DIR [-S key=value ...]
#
# The -S overrides go to `dvc exp run` after the GPT-2 124M defaults below
# (batch 16 x 1024 tokens, as in shared reference runs), so they win.
# OUT_DIR gets results.tar.gz (metrics, summary, plots, profiles, dvc.lock)
# and the log. Needs dvc importable by python3 (e.g. installed from wheels).
set -euo pipefail
out=$(realpath "$1"); shift
src=$(pwd)
# The scratch copy gets a throwaway commit; record the one the run came from.
export BENCHLAB_GIT_COMMIT=${BENCHLAB_GIT_COMMIT:-$(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)}
work=$(mktemp -d)
mkdir -p "$out"
mkdir -p "$work/repo" "$work/bin"
tar -C "$src" --exclude=./.whl --exclude=./.git -cf - . | tar -C "$work/repo" -xf -
# dvc.yaml calls `python`; some images only have python3.
command -v python >/dev/null || { ln -s "$(command -v python3)" "$work/bin/python"; export PATH="$work/bin:$PATH"; }
cd "$work/repo"
git init -q && git add -A && git -c user.name=gpu -c user.email=gpu@localhost commit -qm snapshot
export PYTHONUNBUFFERED=1
python3 -m dvc exp run \
  -S model=gpt2_124m -S train.batch_size=16 -S train.block_size=1024 \
  -S train.steps=50 -S train.lr=0.0006 -S train.min_lr=0.00006 \
  -S bench.steps=30 -S bench.warmup_steps=10 -S bench.repeats=5 \
  -S eval.batches=8 -S profile.steps=2 "$@" 2>&1 | tee "$out/dvc_log.txt"
python3 -m dvc metrics show > "$out/metrics_show.txt" 2>&1 || true
tar czf "$out/results.tar.gz" params.yaml dvc.lock metrics plots
echo "packed $(du -h "$out/results.tar.gz" | cut -f1) into $out/results.tar.gz"
