#!/bin/sh
# The 1 GB / 100 MB measurements on a quiet machine, each prepare pinned to its own two cores
# (taskset), the two 1 GB runs side by side for the determinism check. Results in $OUT/*.json.
set -e
B=/tmp/bench; mkdir -p $B
python3 scripts/bench_prepare.py corpus $B/c1g.txt 1000000000 > $OUT/corpus_1g.json
python3 scripts/bench_prepare.py corpus $B/c100m.txt 100000000 > $OUT/corpus_100m.json
export RAYON_NUM_THREADS=2
taskset -c 0,1 python3 scripts/bench_prepare.py run $B/c1g.txt $B/out1g_a > $OUT/run_1g_a.json 2> $OUT/run_1g_a.err &
taskset -c 2,3 python3 scripts/bench_prepare.py run $B/c1g.txt $B/out1g_b > $OUT/run_1g_b.json 2> $OUT/run_1g_b.err &
( taskset -c 4,5 python3 scripts/bench_prepare.py run $B/c100m.txt $B/out100 > $OUT/run_100m.json 2> $OUT/run_100m.err
  RAYON_NUM_THREADS=1 taskset -c 4 python3 scripts/bench_prepare.py throughput $B/c100m.txt $B/out100 > $OUT/throughput_1core.json
  taskset -c 4,5 python3 scripts/bench_prepare.py throughput $B/c100m.txt $B/out100 > $OUT/throughput_2core.json ) &
wait
cmp $B/out1g_a/train.bin $B/out1g_b/train.bin && cmp $B/out1g_a/val.bin $B/out1g_b/val.bin && cmp $B/out1g_a/tokenizer.json $B/out1g_b/tokenizer.json && echo identical > $OUT/determinism.txt
lscpu | grep -E "Model name|^CPU\(s\)" > $OUT/cpu.txt
