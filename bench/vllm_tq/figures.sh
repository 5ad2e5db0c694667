#!/usr/bin/env bash
# vLLM's TurboQuant on stories260K (5 layers: vLLM always keeps 0, 1, 3, 4, so layer 2 is the one
# choice besides the preset): per preset, vLLM's default (the preset with its forced layers only)
# against kvq's choice at the same bytes (--bpd = the default's bits per dim, every preset
# allowed), and kvq's fewest bytes for the default's measured error (--max-error = its error).
# Quality on text the calibration never saw: kvq-verify's held-out windows (RoPE-logit MAE, softmax
# KL) and kvq-eval's perplexity. The demo model (4 layers) is not run: vLLM keeps all of its layers.
#   bench/vllm_tq/figures.sh [OUT_DIR]      (needs ../shared and a built tree; ~6 min on 2 cores)
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${KVQ_BUILD:-$here/build}/bin"
shared="${KVQ_SHARED:-$here/../shared}"
out="${1:-/tmp/kvq-vllm-tq}"
mkdir -p "$out"
corpus="$shared/corpora/wikitext2-train-sample.txt"
[ -f "$corpus" ] || { echo "figures.sh: $corpus missing (needs ../shared)" >&2; exit 2; }
head -n 2400 "$corpus" > "$out/calib.txt"    # calibration: the first 2400 lines
tail -n 1000 "$corpus" > "$out/heldout.txt"   # evaluation: the last 1000 (no overlap: kvq-eval checks)
model="$shared/models/stories260K/stories260K.bin"
cal="$out/stories.kvqcal.h5"
[ -f "$cal" ] || "$bin/calib-capture" -q --model "$model" --corpus "$out/calib.txt" --samples 64 --seq-len 256 \
  --holdout 8 --reservoir-tokens 2048 --out "$cal"

measure() {  # alloc -> alloc.verify.json alloc.eval.json alloc.m.json
  local a="$1"
  "$bin/kvq-inspect" "$a" --json "$a.m.json" > /dev/null
  "$bin/kvq-verify" -q --calib "$cal" --alloc "$a" --baseline-k-bpd 4 --baseline-v-bpd 4 --json "$a.verify.json"
  "$bin/kvq-eval" -q --model "$model" --alloc "$a" --calib "$cal" --text "$out/heldout.txt" --window 256 \
    --stride 128 --max-tokens 40000 --baseline none --json "$a.eval.json"
}
field() { python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print(m['summary']['joint']['params'][sys.argv[2]])" "$@"; }

rows=()
if [ -n "${KVQ_FIGURES_SUMMARY_ONLY:-}" ]; then rows=("$out"/default_*.kvqalloc.h5 "$out"/same_*.kvqalloc.h5); else
for p in turboquant_k8v4 turboquant_4bit_nc turboquant_k3v4_nc turboquant_3bit_nc; do
  d="$out/default_$p.kvqalloc.h5"
  "$bin/kvq-allocate" -q --calib "$cal" --method vllm-turboquant --presets "$p" --max-error 1e30 --out "$d"
  "$bin/kvq-inspect" "$d" --json "$d.m.json" > /dev/null
  bpd=$(field "$d.m.json" default_bpd)
  err=$(field "$d.m.json" default_error)
  c="$out/same_bytes_$p.kvqalloc.h5"
  "$bin/kvq-allocate" -q --calib "$cal" --method vllm-turboquant --bpd "$bpd" --out "$c"
  m="$out/same_error_$p.kvqalloc.h5"
  "$bin/kvq-allocate" -q --calib "$cal" --method vllm-turboquant --max-error "$err" --out "$m"
  for f in "$d" "$c" "$m"; do measure "$f"; rows+=("$f"); done
done
fi
python3 - "${rows[@]}" <<'PY'
import json, os, sys
print(f"{'allocation':34s} {'preset':20s} {'kept':10s} {'bpd':>6s} {'kvq bpd':>7s} {'att.err':>9s} {'logitMAE':>9s} {'KL':>8s} {'ppl':>8s} {'ppl/fp32':>8s}")
for a in sys.argv[1:]:
    m = json.load(open(a + ".m.json")); v = json.load(open(a + ".verify.json"))["allocation"]["overall"]
    e = json.load(open(a + ".eval.json"))["rows"]; q = [r for r in e if r["coded"]][0]
    t = m["summary"]["vllm_turboquant"]; p = m["summary"]["joint"]["params"]
    c = m["calibration"]
    bpd = m["summary"]["joint"]["budget_assigned"] / (c["n_layers"] * c["n_kv_heads"] * 2 * c["head_dim"])  # the engine's
    kbpd = (m["budget"]["k_bpd_effective"] + m["budget"]["v_bpd_effective"]) / 2  # kvq's packed layout
    print(f"{os.path.basename(a)[:-12]:34s} {t['preset'] or '-':20s} {','.join(map(str, t['kept_layers'])):10s} {bpd:6.2f} {kbpd:7.2f} "
          f"{float(p['error']):9.3f} {v['logit_mae']:9.4f} {v['kl']:8.4f} {q['ppl']:8.3f} {q['ppl_vs_fp32']:8.4f}")
PY
