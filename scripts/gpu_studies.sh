#!/usr/bin/env bash
# Two knob studies side by side on a two-GPU machine, one per GPU, then a learning-parity run on each.
#
#   scripts/gpu_studies.sh OUT_DIR
#
# Each study is one `dvc repro` of its variants (scripts/gpu_matrix.sh: GPT-2 124M, batch 16 x 1024,
# 3 fresh-process repeats) with the recipe among them, so every ratio is measured in one run on one GPU.
# Each parity run trains tf32 and the candidates for PARITY_STEPS (300) steps from one seed (1 repeat; per-step losses
# in plots/steps/), on PARITY_CORPUS_BYTES of this machine's Python sources when set.
#
# Environment:
#   STUDY0, STUDY1     comma-separated variants for GPU 0 and GPU 1 (empty skips that study)
#   PARITY0, PARITY1   comma-separated variants of each GPU's parity run, tf32 first (empty skips it)
#   CANDIDATES         JSON object of variants to add (each with all its knobs), for any of the lists
#   PARITY_STEPS       steps of each parity run (default 300)
#   PARITY_REPEATS     fresh-process runs of each parity variant (default 1); every one's validation loss and mean
#                      training loss over its last 50 steps are in its record (repeat_val_loss, repeat_tail_train_loss)
#   PARITY_CORPUS_BYTES, STUDY_LIMIT_S (default 330), PARITY_LIMIT_S (200),
#   EXTRA              more `-S key=value` overrides for every run (a CPU check: a tiny model)
# OUT_DIR gets <run>/ (results.tar.gz, dvc_log.txt) and <run>.txt for study0, study1, parity0, parity1.
set -uo pipefail
out=$(realpath "$1")
mkdir -p "$out"
here=$(dirname "$(realpath "$0")")
targets() { tr ',' '\n' <<< "$1" | sed 's/^/bench@/' | tr '\n' ' '; }
read -r -a extra <<< "${EXTRA:-}"
corpus=()
if [ -n "${PARITY_CORPUS_BYTES:-}" ]; then  # built before the runs copy the tree, so each copy carries it
  python3 "$here/bench_prepare.py" corpus data/corpus/parity.txt "$PARITY_CORPUS_BYTES" > "$out/parity_corpus.json"
  corpus=(-S data.corpus=data/corpus/parity.txt -S data.tokenizer_sample_bytes=10000000)
fi

on_gpu() {  # GPU, study variants, parity variants, run names
  local gpu=$1 study=$2 parity=$3
  [ -z "$study" ] || CUDA_VISIBLE_DEVICES=$gpu VARIANTS=$study MORE_VARIANTS=${CANDIDATES:-} \
    TARGETS=$(targets "$study") TIME_LIMIT_S=${STUDY_LIMIT_S:-330} "$here/gpu_matrix.sh" "$out/study$gpu" \
    -S bench.repeats=3 -S eval.batches=4 -S aggregate.baseline=recipe "${extra[@]}" > "$out/study$gpu.txt" 2>&1
  [ -z "$parity" ] || CUDA_VISIBLE_DEVICES=$gpu VARIANTS=$parity MORE_VARIANTS=${CANDIDATES:-} \
    TARGETS=$(targets "$parity") TIME_LIMIT_S=${PARITY_LIMIT_S:-200} "$here/gpu_matrix.sh" "$out/parity$gpu" \
    -S bench.repeats=${PARITY_REPEATS:-1} -S bench.steps=${PARITY_STEPS:-300} -S bench.warmup_steps=10 \
    -S train.steps=${PARITY_STEPS:-300} -S eval.batches=8 \
    -S aggregate.baseline="${parity%%,*}" "${corpus[@]}" "${extra[@]}" > "$out/parity$gpu.txt" 2>&1
}
on_gpu 0 "${STUDY0:-}" "${PARITY0:-}" &
sleep 2
on_gpu 1 "${STUDY1:-}" "${PARITY1:-}" &
wait
for f in "$out"/*.txt; do echo "== $f"; tail -n 14 "$f"; done
