#!/usr/bin/env bash
# One call on a two-GPU machine, two independent jobs, one per GPU:
#
#   GPU 0: the seed matrix twice, as two separate `dvc repro` runs in two scratch
#          copies started together; the per-GPU timing lock (benchlab/devlock.py)
#          lets one variant's repeats run at a time, so the runs take turns and a
#          time limit leaves both with the same variants done. For the run-to-run
#          bar of README "NVIDIA H200, run to run".
#   GPU 1: the loss heads and the lean candidates beside the recipe and fp32 (3
#          repeats), then a 300-step learning-parity run of tf32, the recipe and
#          the candidates (1 repeat each; the per-step losses are in plots/steps/).
#
#   scripts/gpu_runs_and_knobs.sh OUT_DIR
#
# Environment: SEED and KNOBS (comma-separated variants of each job; KNOBS empty skips it),
# PARITY_CORPUS_BYTES (build a corpus of that size from this machine's Python sources for the parity run,
# scripts/bench_prepare.py; default: the embedded corpus, which 300 steps of 16 x 1024 tokens cycle 30 times),
# SEED_LIMIT_S (default 555), KNOBS_LIMIT_S (350), PARITY_LIMIT_S (190), EXTRA (more
# `-S key=value` overrides for every job, e.g. a tiny model for a CPU check of the plumbing),
# plus whatever scripts/gpu_matrix.sh reads (BENCHLAB_GIT_COMMIT). Each job's output
# goes to OUT_DIR/<run>/ (results.tar.gz and dvc_log.txt) and OUT_DIR/<run>.txt;
# OUT_DIR/all.tar.gz packs them all.
set -uo pipefail
out=$(realpath "$1")
mkdir -p "$out"
here=$(dirname "$(realpath "$0")")
seed=${SEED:-fp32_baseline,tf32,sdpa,fp16,bf16,fused_adamw,compile,recipe}
recipe='"precision": "bf16", "attention": "sdpa", "compile": true, "fused_adamw": true'
candidates="{\"lean_cce\": {$recipe, \"activation_checkpointing\": \"full\", \"loss\": \"cce\"}}"
knobs=${KNOBS-fp32_baseline,recipe,lean_cce,loss_inline,loss_cce}
parity=tf32,recipe,loss_inline,lean_cce
targets() { tr ',' '\n' <<< "$1" | sed 's/^/bench@/' | tr '\n' ' '; }
read -r -a extra <<< "${EXTRA:-}"  # more -S overrides for every job (a CPU check: a tiny model)

seed_run() {  # one of the two seed-matrix runs on GPU 0
  CUDA_VISIBLE_DEVICES=0 VARIANTS=$seed TARGETS=$(targets $seed) TIME_LIMIT_S=${SEED_LIMIT_S:-555} \
    "$here/gpu_matrix.sh" "$out/$1" -S bench.repeats=3 -S bench.steps=15 -S bench.warmup_steps=5 \
    -S eval.batches=2 -S aggregate.baseline="${seed%%,*}" "${extra[@]}" > "$out/$1.txt" 2>&1
}
gpu1() {
  [ -z "$knobs" ] || CUDA_VISIBLE_DEVICES=1 VARIANTS=$knobs MORE_VARIANTS=$candidates TARGETS=$(targets $knobs) \
    TIME_LIMIT_S=${KNOBS_LIMIT_S:-350} "$here/gpu_matrix.sh" "$out/knobs" -S bench.repeats=3 \
    -S eval.batches=4 -S aggregate.baseline=recipe "${extra[@]}" > "$out/knobs.txt" 2>&1
  CUDA_VISIBLE_DEVICES=1 VARIANTS=$parity MORE_VARIANTS=$candidates TARGETS=$(targets $parity) \
    TIME_LIMIT_S=${PARITY_LIMIT_S:-190} "$here/gpu_matrix.sh" "$out/parity" -S bench.repeats=1 \
    -S bench.steps=300 -S bench.warmup_steps=10 -S train.steps=300 -S eval.batches=8 \
    -S aggregate.baseline=tf32 "${corpus[@]}" "${extra[@]}" > "$out/parity.txt" 2>&1
}
corpus=()
if [ -n "${PARITY_CORPUS_BYTES:-}" ]; then  # real text of this machine, so that 300 steps do not cycle the corpus
  # Built before the jobs copy the tree, which then carries it into every scratch copy.
  python3 "$here/bench_prepare.py" corpus data/corpus/parity.txt "$PARITY_CORPUS_BYTES" > "$out/parity_corpus.json"
  corpus=(-S data.corpus=data/corpus/parity.txt -S data.tokenizer_sample_bytes=10000000)
fi
seed_run seed-b &
sleep 3
seed_run seed-c &
gpu1 &
wait
tar -C "$out" -czf "$out.tar.gz" . && mv "$out.tar.gz" "$out/all.tar.gz"
for f in "$out"/*.txt; do echo "== $f"; tail -n 12 "$f"; done
