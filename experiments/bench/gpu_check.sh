#!/usr/bin/env bash
# The accelerator check: two benchmark parts, each under its own timeout, merged into one JSON.
#
#   model_gpu   experiments/bench/model_gpu.py (through bare.py): training tokens/s and MFU of a
#               Qwen2.5-1.5B-shaped bf16 step (B8 L2048), decode tokens/s at batch 64
#   gpu_update  experiments/bench/gpu_update.py: one update of the paper-1.5b ALFWorld preset split into
#               generate / credit / update (MFU from the config's FLOPs), and the sampler's decode throughput
#               against the HBM-bandwidth bound (formulas in its docstring)
#
# A part that fails or times out leaves the other's numbers; its status, exit code and the tail of its log go
# into the JSON (a part's JSON is kept up to where it stopped: gpu_update rewrites its file after every stage).
# Output: $OUT/gpu_check.json (and the logs in $OUT/gpu_check_logs/) when OUT is set, else
# experiments/bench/results/gpu_check.json; --dry-run without OUT: ${TMPDIR:-/tmp}/gpu_check_dry_run.json.
#
#   bash experiments/bench/gpu_check.sh            # the GPU machine: <= 8 min (timeouts 170 s + 300 s)
#   bash experiments/bench/gpu_check.sh --dry-run  # tiny shapes on any CPU (the two parts run side by side)
#
# Needs only jax, flax, optax, orbax, chex, jaxtyping and numpy (bare.py stands in for the rest); the repository
# root goes on PYTHONPATH, nothing is installed. Environment: PYTHON (default python3), OUT,
# MODEL_GPU_TIMEOUT and GPU_UPDATE_TIMEOUT (seconds). Exit status 1 if a part failed (the JSON is still written).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BENCH=$ROOT/experiments/bench
DRY=0
for arg in "$@"; do
  case $arg in
    --dry-run) DRY=1 ;;
    *) echo "usage: bash experiments/bench/gpu_check.sh [--dry-run]" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-$(command -v python3 || command -v python)}
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
if [ -n "${OUT:-}" ]; then
  DEST=$OUT/gpu_check.json
elif [ "$DRY" = 1 ]; then
  DEST=${TMPDIR:-/tmp}/gpu_check_dry_run.json
else
  DEST=$BENCH/results/gpu_check.json
fi
mkdir -p "$(dirname "$DEST")"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

if [ "$DRY" = 1 ]; then
  MODEL_ARGS=(--dry-run --peak-flops 1e12)  # nominal peak: the CPU has no data-sheet entry
  UPDATE_ARGS=(--dry-run)
  T_MODEL=${MODEL_GPU_TIMEOUT:-300}
  T_UPDATE=${GPU_UPDATE_TIMEOUT:-300}
  # tiny programs: cheaper compiles matter more than faster code
  export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
else
  MODEL_ARGS=()
  UPDATE_ARGS=()
  T_MODEL=${MODEL_GPU_TIMEOUT:-170}
  T_UPDATE=${GPU_UPDATE_TIMEOUT:-300}
fi

run_part() {  # name timeout command... : runs it, logs it, appends "name rc seconds" to $WORK/status
  local name=$1 limit=$2
  shift 2
  local start end rc
  start=$(date +%s.%N)
  if command -v timeout > /dev/null; then
    timeout -k 10 "$limit" "$@" > "$WORK/$name.log" 2>&1
  else
    "$@" > "$WORK/$name.log" 2>&1
  fi
  rc=$?
  end=$(date +%s.%N)
  echo "$name $rc $(awk "BEGIN {print $end - $start}")" >> "$WORK/status"
  echo "== $name: exit $rc (timeout ${limit}s)"
  cat "$WORK/$name.log"
}

START=$(date +%s.%N)
echo "gpu_check: $PY ($("$PY" --version 2>&1)), dry run $DRY, writing $DEST"
MODEL_CMD=("$PY" "$BENCH/bare.py" model_gpu "${MODEL_ARGS[@]}" --out "$WORK/model_gpu.json")
UPDATE_CMD=("$PY" "$BENCH/gpu_update.py" "${UPDATE_ARGS[@]}" --out "$WORK/gpu_update.json")
if [ "$DRY" = 1 ]; then  # CPU only: side by side (on an accelerator each part takes the device's memory)
  run_part model_gpu "$T_MODEL" "${MODEL_CMD[@]}" > "$WORK/model_gpu.out" &
  run_part gpu_update "$T_UPDATE" "${UPDATE_CMD[@]}" > "$WORK/gpu_update.out"
  wait
  cat "$WORK/model_gpu.out" "$WORK/gpu_update.out"
else
  run_part model_gpu "$T_MODEL" "${MODEL_CMD[@]}"
  run_part gpu_update "$T_UPDATE" "${UPDATE_CMD[@]}"
fi
TOTAL=$(awk "BEGIN {print $(date +%s.%N) - $START}")
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT/gpu_check_logs" && cp "$WORK"/*.log "$OUT/gpu_check_logs/"
fi

"$PY" - "$WORK" "$DEST" "$DRY" "$TOTAL" "$T_MODEL" "$T_UPDATE" <<'EOF'
import datetime, json, math, pathlib, platform, sys

work, dest, dry, total, t_model, t_update = sys.argv[1:]
work = pathlib.Path(work)
limits = {"model_gpu": float(t_model), "gpu_update": float(t_update)}
parts, merged = {}, {}
for line in (work / "status").read_text().splitlines():
    name, rc, seconds = line.split()
    rc = int(rc)
    status = "ok" if rc == 0 else "timeout" if rc in (124, 137) else "error"
    part = dict(status=status, exit_code=rc, seconds=float(seconds), timeout_s=limits[name])
    try:
        merged[name] = json.loads((work / f"{name}.json").read_text())
    except (OSError, ValueError) as err:
        merged[name] = None
        if status == "ok":
            status = part["status"] = "error"
        part["json_error"] = f"{type(err).__name__}: {err}"
    if status != "ok":
        part["log_tail"] = (work / f"{name}.log").read_text(errors="replace").splitlines()[-40:]
    stages = (merged[name] or {}).get("results", []) if name == "gpu_update" else []
    failed = [r["stage"] for r in stages if r.get("status") != "ok"]
    if failed:
        part["failed_stages"] = failed
    parts[name] = part
meta = dict(script="experiments/bench/gpu_check.sh", dry_run=dry == "1", total_s=float(total), parts=parts,
            host=platform.node(), date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
out = dict(meta=meta, model_gpu=merged.get("model_gpu"), gpu_update=merged.get("gpu_update"))
pathlib.Path(dest).write_text(json.dumps(out, indent=2) + "\n")


def num(x, fmt="{:.4g}"):
    return fmt.format(x) if isinstance(x, int | float) and math.isfinite(x) else "n/a"


print(f"\ngpu_check summary ({float(total):.0f} s; dry run: {meta['dry_run']})")
for name, part in parts.items():
    print(f"  {name}: {part['status']} (exit {part['exit_code']}, {part['seconds']:.0f} s)"
          + (f", failed stages {part['failed_stages']}" if part.get("failed_stages") else ""))
for r in (merged.get("model_gpu") or {}).get("results", []):
    print(f"  model_gpu {r['metric']} {r['shape']}: {num(r.get('tokens_per_s'))} tok/s, MFU {num(r.get('mfu'))}")
stages = {r["stage"]: r for r in (merged.get("gpu_update") or {}).get("results", [])}
if stages.get("update", {}).get("status") == "ok":
    u = stages["update"]
    print(f"  update: {u['micro_batches_timed']}/{u['micro_batches_full']} micro-batches in {num(u['update_s'])} s, "
          f"MFU {num(u.get('mfu'))}, full update ~{num(u['full_update_s'])} s, compile {num(u['compile_s'])} s")
if stages.get("generate", {}).get("status") == "ok":
    g = stages["generate"]
    print(f"  generate: {num(g.get('generate_s'))} s for {g['turns']} calls ({num(g.get('tokens_per_s'))} tok/s)")
if stages.get("credit", {}).get("status") == "ok":
    print(f"  credit: {num(stages['credit']['credit_s'])} s")
if stages.get("decode_roofline", {}).get("status") == "ok":
    d = stages["decode_roofline"]
    print(f"  decode at B{d['rows']}: {num(d['tokens_per_s'])} tok/s vs HBM bound {num(d.get('bound_tokens_per_s'))}"
          f" -> ratio {num(d.get('ratio'), '{:.3f}')} (measured bandwidth: {num(d.get('ratio_measured_bw'), '{:.3f}')})")
print(f"wrote {dest}")
sys.exit(0 if all(p["status"] == "ok" and not p.get("failed_stages") for p in parts.values()) else 1)
EOF
