#!/usr/bin/env bash
# The layer-streamed capture at real shapes (issue 13). Usage:
#   bench/stream/stream.sh SHAPE [SAMPLES] [SEQ_LEN] [MODES]
# SHAPE 1b | 8b | 70b (70b: a 2-layer checkpoint, per-layer figures); MODES "whole stream" (default)
# or "stream". Writes the synthetic checkpoint under $KVQ_SYNTH_DIR (default build/synthetic) once,
# then prints, per mode, wall seconds, peak RSS, tokens/s and the forward's GFLOP/s, followed by
# this machine's fp32 and BF16 GEMM rates (bench_gemm_peak) from the same run; extra flags after MODES (e.g. --precision bf16) go to calib-capture. Needs a built tree.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${KVQ_BUILD:-$root/build}/bin
shape=${1:?shape 1b, 8b or 70b}
samples=${2:-16}
seq=${3:-512}
modes=${4:-whole stream}
synth=${KVQ_SYNTH_DIR:-$root/build/synthetic}
model=$synth/$shape
layers=()
[ "$shape" = 70b ] && layers=(--layers 2)
if [ ! -f "$model/model.safetensors.index.json" ]; then
  rm -rf "$model"
  "$bin/bench-make-hf" --shape "$shape" --out "$model" "${layers[@]}"
fi
corpus=$(source "$root/scripts/lib.sh" && kvq_default_corpus)
flops=$(python3 - "$model/config.json" "$seq" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); T = int(sys.argv[2])
D, L, H, Hk, I = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"]
d = c.get("head_dim", D // H)
per_tok = L * (2 * D * (H + 2 * Hk) * d + 2 * D * H * d + 6 * D * I + 4 * H * d * (T + 1) / 2)
print(per_tok)
PY
)
for mode in $modes; do
  out=$(mktemp -d)/c.kvqcal.h5
  log=$(mktemp)
  /usr/bin/time -f "%e %M" -o "$log.time" "$bin/calib-capture" -q --model "$model" --corpus "$corpus" \
    --samples "$samples" --holdout 4 --seq-len "$seq" --load "$mode" --out "$out" "${@:5}"
  read -r wall rss_kb <"$log.time"
  python3 - "$mode" "$wall" "$rss_kb" "$samples" "$seq" "$flops" <<'PY'
import sys
mode, wall, rss, n, T, f = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
tok = (n + 4) * T  # calibration + 4 held-out windows, all forwarded
print(f"{mode:6s} wall {wall:8.1f} s  peak RSS {rss / 2**20:6.2f} GiB  {tok / wall:8.1f} tok/s  "
      f"forward {f * tok / wall / 1e9:6.1f} GFLOP/s (whole run, incl. load and file)")
PY
  rm -rf "$(dirname "$out")" "$log" "$log.time"
done
"$bin/bench_gemm_peak" --benchmark_min_time=1 2>/dev/null | grep BM_
