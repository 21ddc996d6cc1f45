#!/usr/bin/env bash
# Time the README's CPU commands as a new user meets them: on a fresh clone, in the README's
# order, each as written (placeholders filled as a user would), with one line per command.
#
#   scripts/readme_walk.sh CLONE_DIR LOG_FILE
#   ONLY="quick-start-1 quick-start-2" scripts/readme_walk.sh CLONE_DIR LOG_FILE   # some of them, in order
#
# Every command below is checked to appear verbatim in README.md first, so the walk fails
# when the README changes without it. Left out: the lines that need the network
# (`dvc import-url`), a corpus the user has (`/data/...`), a GPU or a second node.
# "/path/to/my_text.txt" becomes a 1 MB slice of this Python's own documentation text.
set -uo pipefail
src=$(pwd)
clone=$1
log=$(realpath -m "$2")
: > "$log"
text=$(mktemp --suffix=.txt)
find "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')" -name "*.py" | sort | head -400 \
  | xargs cat | head -c 1000000 > "$text"

readme_has() {
  grep -qF -- "$1" "$src/README.md" || { echo "README.md no longer has: $1" | tee -a "$log"; exit 1; }
}

step() {  # step NAME README_COMMAND [COMMAND_AS_RUN]
  local name=$1 shown=$2 run=${3:-$2}
  readme_has "$shown"
  case " ${ONLY:-$name} " in *" $name "*) ;; *) return ;; esac  # ONLY="a b": time just those, in order
  local t0 rc
  t0=$(date +%s)
  ( cd "$clone" && . .venv/bin/activate 2>/dev/null; bash -c "$run" ) > "$log.$name.txt" 2>&1
  rc=$?
  printf '%-14s exit %-3s %4d s  %s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$shown" | tee -a "$log"
}

rm -rf "$clone"
git clone -q "$src" "$clone"
q1='python3 -m venv .venv && . .venv/bin/activate && pip install -r requirements.txt && dvc repro'
q2='python3 -m venv .venv && . .venv/bin/activate && pip install -r requirements-test.txt && python -m pytest -q'
own='dvc exp run --temp -S data.corpus=/path/to/my_text.txt evaluate'
step quick-start-1 "$q1"
step quick-start-2 "$q2"
step own-text "$own" "${own//\/path\/to\/my_text.txt/$text}"
step exp-sdpa 'dvc exp run --temp -S attention=sdpa'
step exp-bf16 'dvc exp run --temp -S precision=bf16 -S train.steps=50'
step exp-selective 'dvc exp run --temp -S attention=sdpa -S activation_checkpointing=selective'
step exp-compile 'dvc exp run --temp -S compile=true -S fused_adamw=true'
step exp-model 'dvc exp run --temp -S model=gpt_small -S train.steps=100 evaluate'
step exp-show-wide 'dvc exp show --only-changed'
step exp-show "dvc exp show --hide-failed --drop '.*' --keep '^Experiment\$|^tokens_per_sec\$|^peak_(mem_allocated|rss)_mb\$|^metrics/eval.json:val_loss\$|^precision\$|^attention\$|^compile\$'"
step metrics-diff 'dvc metrics diff'
step plots-diff 'dvc plots diff <exp> <exp>' 'dvc plots diff $(dvc exp ls --name-only | tail -n 2)'
step plots-show 'dvc plots show'
rm -f "$text"
