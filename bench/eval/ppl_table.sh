#!/bin/sh
# Perplexity table of kvq-eval: methods x budgets x cache policy, for one model.
#   bench/eval/ppl_table.sh BIN_DIR MODEL CALIB_TEXT EVAL_TEXT OUT_DIR [MAX_TOKENS] [WINDOW] [STRIDE]
# Calibrates on CALIB_TEXT, allocates K with uniform / block-gtq / cobra-mse / cobra-kl at 2, 3, 4
# bpd (V uniform at the same bits), and evaluates each on EVAL_TEXT with a plain coded cache and with
# --sink 4 --recent 128. One JSON per run in OUT_DIR, and OUT_DIR/table.tsv.
set -eu
BIN=$1 MODEL=$2 CAL_TEXT=$3 EVAL_TEXT=$4 OUT=$5
MAXTOK=${6:-2048} WINDOW=${7:-256} STRIDE=${8:-128}
THREADS=${THREADS:-1}
mkdir -p "$OUT"
CAL=$OUT/cal.kvqcal.h5
[ -f "$CAL" ] || SOURCE_DATE_EPOCH=1 "$BIN/calib-capture" -q --threads "$THREADS" --model "$MODEL" \
  --corpus "$CAL_TEXT" --samples 64 --seq-len 256 --holdout 2 --out "$CAL"
printf 'method\tbpd\tk_eff\tv_eff\tppl_fp32\tppl\tppl_sink4_recent128\n' > "$OUT/table.tsv"
for bpd in 2 3 4; do
  for m in uniform block-gtq cobra-mse cobra-kl; do
    A=$OUT/$m-$bpd.kvqalloc.h5
    [ -f "$A" ] || "$BIN/kvq-allocate" -q --calib "$CAL" --method "$m" --bpd "$bpd" --out "$A"
    for prot in plain protected; do
      J=$OUT/$m-$bpd-$prot.json
      extra=""
      [ "$prot" = protected ] && extra="--sink 4 --recent 128"
      [ -f "$J" ] || "$BIN/kvq-eval" -q --threads "$THREADS" --model "$MODEL" --alloc "$A" --calib "$CAL" \
        --text "$EVAL_TEXT" --baseline none --max-tokens "$MAXTOK" --window "$WINDOW" --stride "$STRIDE" \
        $extra --json "$J"
    done
    python3 - "$OUT/$m-$bpd-plain.json" "$OUT/$m-$bpd-protected.json" "$m" "$bpd" >> "$OUT/table.tsv" <<'PY'
import json, sys
p, q = (json.load(open(f)) for f in sys.argv[1:3])
a, b = p["rows"][1], q["rows"][1]
print("\t".join([sys.argv[3], sys.argv[4], "%.3f" % a["k_bpd_effective"], "%.3f" % a["v_bpd_effective"],
                 "%.4f" % p["rows"][0]["ppl"], "%.4f" % a["ppl"], "%.4f" % b["ppl"]]))
PY
  done
done
cat "$OUT/table.tsv"
