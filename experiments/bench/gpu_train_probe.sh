#!/usr/bin/env bash
# Where the GPU training step's time goes: the first H200 run of gpu_check.sh (2026-12-04) saw model_gpu's 28-layer
# step print nothing for 150 s and a 4-layer one nothing for 185 s. This script runs model_gpu.py (through bare.py)
# three times, each under its own timeout, with the compiles logged (JAX_LOG_COMPILES) and every Python stack
# printed every 30 s, so a stall shows where it is:
#
#   l1_default    1 block, B1 L512, 3 steps, XLA's default flags
#   l1_autotune0  the same with --xla_gpu_autotune_level=0 (no GEMM autotuning: is autotuning the compile time?)
#   l28           the whole Qwen2.5-1.5B shape, B8 L2048, 5 steps, under the flags whose 1-block compile was faster
#
# Output in $OUT (default ${TMPDIR:-/tmp}/gpu_train_probe): probe_status.txt (phase, exit code, seconds), each
# phase's log and JSON. `--dry-run`: the tiny config on any CPU (model_gpu --dry-run), all three phases.
#
#   bash experiments/bench/gpu_train_probe.sh            # the GPU machine: <= 7.5 min (timeouts 100 + 100 + 240 s)
#   bash experiments/bench/gpu_train_probe.sh --dry-run
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PYTHON:-$(command -v python3 || command -v python)}
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
OUT=${OUT:-${TMPDIR:-/tmp}/gpu_train_probe}
mkdir -p "$OUT"
DRY=()
[ "${1:-}" = "--dry-run" ] && DRY=(--dry-run)
STATUS=$OUT/probe_status.txt
: > "$STATUS"
{ date -u +%FT%TZ; "$PY" --version; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
  2>/dev/null || echo "no nvidia-smi"; } >> "$STATUS"

phase() {  # name timeout xla_flags model_gpu-arguments...
  local name=$1 limit=$2 flags=$3 start rc
  shift 3
  start=$(date +%s.%N)
  XLA_FLAGS="$flags" JAX_LOG_COMPILES=1 timeout -k 5 "$limit" "$PY" "$ROOT/experiments/bench/bare.py" model_gpu \
    "$@" "${DRY[@]}" --skip-decode --stack-dump-every 30 --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  rc=$?
  echo "$name exit $rc seconds $(awk "BEGIN {print $(date +%s.%N) - $start}") XLA_FLAGS='$flags'" >> "$STATUS"
  grep -E "initialised|compiled in|first step|^train " "$OUT/$name.log" | sed "s/^/  $name: /" >> "$STATUS"
}

compile_s() {  # the phase's compile seconds from its log, or a large number when it did not compile
  sed -n 's/.*compiled in \([0-9.]*\) s.*/\1/p' "$OUT/$1.log" | head -1 | grep . || echo 1e9
}

phase l1_default 100 "" --layers 1 --batch 1 --seq 512 --steps 3
phase l1_autotune0 100 "--xla_gpu_autotune_level=0" --layers 1 --batch 1 --seq 512 --steps 3
FLAGS=""
if awk "BEGIN {exit !($(compile_s l1_autotune0) < 0.5 * $(compile_s l1_default))}"; then
  FLAGS="--xla_gpu_autotune_level=0"
fi
phase l28 240 "$FLAGS" --batch 8 --seq 2048 --steps 5
cat "$STATUS"
