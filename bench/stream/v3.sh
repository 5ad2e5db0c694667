#!/usr/bin/env bash
# DeepSeek-V3 on one machine (issue 33, part 4). Usage:
#   bench/stream/v3.sh [SAMPLES] [SEQ_LEN] [extra calib-capture flags]
# Writes two synthetic checkpoints of DeepSeek-V3's real widths under $KVQ_SYNTH_DIR (default
# build/synthetic), FP8 E4M3 with 128x128 block scales as it ships, the demo tokenizer (bench-make-hf
# --shape v3): v3-1 (its dense layer alone) and v3-3 (1 dense + 2 MoE layers of 256 experts,
# ~23 GB). Runs the streamed capture on each (default 8 windows of 256 tokens, as the issue's
# benchmark), prints wall seconds and peak RSS (/usr/bin/time), then the plan for the real model
# (61 layers: 3 dense + 58 MoE) from the per-layer times: wall per calibration token, memory (the
# streamed peak does not grow with the depth) and the bytes read per chunk pass (the whole
# checkpoint). Needs a built tree; ~5 min and 24 GB of disk on this 2-core machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${KVQ_BUILD:-$root/build}/bin
samples=${1:-8}
seq=${2:-256}
synth=${KVQ_SYNTH_DIR:-$root/build/synthetic}
corpus=$(source "$root/scripts/lib.sh" && kvq_default_corpus)
declare -A wall rss
for layers in 1 3; do
  model=$synth/v3-$layers
  if [ ! -f "$model/model.safetensors.index.json" ]; then
    rm -rf "$model"
    "$bin/bench-make-hf" --shape v3 --layers "$layers" --out "$model"
  fi
  out=$(mktemp -d)
  /usr/bin/time -f "%e %M" -o "$out/time" "$bin/calib-capture" --model "$model" --corpus "$corpus" \
    --samples "$samples" --holdout 0 --seq-len "$seq" --load stream --out "$out/c.kvqcal.h5" "${@:3}" 2>"$out/log"
  grep -E "memory plan|disk plan" "$out/log" | sed "s/^/v3-$layers: /"
  read -r w r <"$out/time"
  wall[$layers]=$w
  rss[$layers]=$r
  echo "v3-$layers: wall ${w} s, peak RSS $(python3 -c "print(f'{$r / 2**20:.2f}')") GiB"
  rm -rf "$out"
done
python3 - "$synth/v3-3" "$samples" "$seq" "${wall[1]}" "${wall[3]}" "${rss[3]}" <<'PY'
import glob, json, os, sys
model, n, T, w1, w3, rss = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
tokens = n * T
# w1: the dense layer + fixed costs (load, embedding, file); w3 - w1: two MoE layers.
moe = (w3 - w1) / 2
dense = w1
layer_bytes = {}
idx = json.load(open(f"{model}/model.safetensors.index.json"))["weight_map"]
sizes = {}
for shard in set(idx.values()):
    with open(f"{model}/{shard}", "rb") as f:
        h = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    for k, v in h.items():
        if k != "__metadata__":
            sizes[k] = v["data_offsets"][1] - v["data_offsets"][0]
per_layer = {}
for k, b in sizes.items():
    if k.startswith("model.layers."):
        l = int(k.split(".")[2])
        per_layer[l] = per_layer.get(l, 0) + b
dense_b, moe_b = per_layer[0], per_layer[1]
real = 3 * dense_b + 58 * moe_b
secs = 3 * dense + 58 * moe
print(f"per layer here: dense {dense:.1f} s (incl. fixed costs), MoE {moe:.1f} s for {tokens} tokens; "
      f"stored: dense {dense_b / 1e9:.2f} GB, MoE {moe_b / 1e9:.2f} GB")
print(f"plan for DeepSeek-V3 (61 layers: 3 dense + 58 MoE), streamed, {n} x {T} tokens a chunk on this machine: "
      f"peak RSS {rss / 2**20:.2f} GiB (does not grow with depth), {real / 1e9:.0f} GB read per chunk pass, "
      f"~{secs / 3600:.2f} h per chunk = {secs / tokens:.2f} s per calibration token")
PY
