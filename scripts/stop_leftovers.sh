# Sourced by the GPU scripts. `timeout --signal=KILL` stops DVC, but not a stage's processes in sessions of
# their own (a repeat's child, torchrun's ranks, inductor's compile and autotune workers): on 2026-11-30 one such
# leftover kept autotuning on a GPU into the next call and slowed its two-GPU runs. After a time limit, every
# Python process working in the given directory is killed.
stop_leftovers() {  # DIR
  local dir pid
  dir=$(realpath "$1")
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    case "$(cat "/proc/$pid/comm" 2>/dev/null)" in python*) ;; *) continue;; esac
    case "$(readlink "/proc/$pid/cwd" 2>/dev/null)" in "$dir"|"$dir"/*) kill -KILL "$pid" 2>/dev/null || true;; esac
  done
}
