#!/usr/bin/env python3
"""The fp16 SDPA baseline and the table of scripts/gpu-check.

  gpu_attention_table.py sdpa OUT.json
      Times torch's fp16 scaled_dot_product_attention(enable_gqa=True) for one decode step (one
      query token per sequence) at the shapes of bench_cuda_attention: 32/8 and 16/2 heads, d 128,
      T in {8K, 32K, 128K, 512K}, batch 1 and 16; the L2 flushed (a 512 MiB write) before every
      timed call, CUDA events around the call alone, mean of 20 (as the C++ benchmark). Exits 3
      when torch or a CUDA device is missing (the caller reports the baseline as absent).
  gpu_attention_table.py table BENCH.json [SDPA.json] > TABLE.md
      One markdown table: every attention_step row of the Google Benchmark JSON with its us,
      GB/s, fractions of peak and copy, and, where SDPA ran at the same shape, its us and the
      ratio SDPA / kvq (> 1: kvq faster).
"""
import json
import sys

SHAPES = [(32, 8), (16, 2)]
TOKENS = [8192, 32768, 131072, 524288]
BATCHES = [1, 16]
D = 128
REPS = 20
MIXES = ["tq_k3v3", "tq_k2v2", "gtq_compact_3bpd", "lowrank_r16b4_tqv3", "kivi2", "fp8", "nvfp4"]  # bench mix ids


def sdpa(out_path):
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("no torch in this python3: no SDPA baseline", file=sys.stderr)
        return 3
    if not torch.cuda.is_available():
        print("torch sees no CUDA device: no SDPA baseline", file=sys.stderr)
        return 3
    dev = torch.device("cuda")
    flush = torch.empty(512 << 20, dtype=torch.uint8, device=dev)
    rows = []
    for n_q, n_kv in SHAPES:
        for T in TOKENS:
            for B in BATCHES:
                need = 2 * B * n_kv * T * D * 2
                free, _ = torch.cuda.mem_get_info()
                if need + (1 << 30) > free:
                    rows.append({"n_q": n_q, "n_kv": n_kv, "T": T, "batch": B, "skipped": "memory"})
                    continue
                q = torch.randn(B, n_q, 1, D, dtype=torch.float16, device=dev)
                k = torch.randn(B, n_kv, T, D, dtype=torch.float16, device=dev)
                v = torch.randn(B, n_kv, T, D, dtype=torch.float16, device=dev)
                F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # warm-up, kernel choice
                torch.cuda.synchronize()
                total = 0.0
                for i in range(REPS):
                    flush.fill_(i & 0xFF)
                    a = torch.cuda.Event(enable_timing=True)
                    b = torch.cuda.Event(enable_timing=True)
                    a.record()
                    F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                    b.record()
                    b.synchronize()
                    total += a.elapsed_time(b)
                us = total * 1e3 / REPS
                rows.append({"n_q": n_q, "n_kv": n_kv, "T": T, "batch": B, "us": us,
                             "GB/s": need / (us * 1e3)})
                del q, k, v
                torch.cuda.empty_cache()
    with open(out_path + ".tmp", "w") as f:
        json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)
    import os
    os.replace(out_path + ".tmp", out_path)
    return 0


def parse_name(name):
    # attention_step/n_q:32/n_kv:8/T:8192/batch:1/mix:0/iterations:20/manual_time
    fields = {}
    for part in name.split("/")[1:]:
        if ":" in part:
            key, val = part.split(":", 1)
            if key in ("n_q", "n_kv", "T", "batch", "mix"):
                fields[key] = int(val)
    return fields


def table(bench_path, sdpa_path=None):
    with open(bench_path) as f:
        bench = json.load(f)
    base = {}
    if sdpa_path:
        try:
            with open(sdpa_path) as f:
                for r in json.load(f)["rows"]:
                    if "us" in r:
                        base[(r["n_q"], r["n_kv"], r["T"], r["batch"])] = r["us"]
        except (OSError, ValueError, KeyError) as e:
            print(f"{sdpa_path}: unreadable ({e}): table without the SDPA baseline", file=sys.stderr)
    print("| shape (q/kv/d) | T | batch | coding | kvq us | GB/s | of peak | of copy | fp16 SDPA us | SDPA / kvq |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for b in bench.get("benchmarks", []):
        if not b["name"].startswith("attention_step/"):
            continue
        f = parse_name(b["name"])
        label = MIXES[f["mix"]] if f.get("mix", -1) in range(len(MIXES)) else str(f.get("mix"))
        shape = f"{f['n_q']}/{f['n_kv']}/128"
        if b.get("error_occurred"):
            print(f"| {shape} | {f['T']} | {f['batch']} | {label} | skipped: {b.get('error_message', '')} | | | | | |")
            continue
        us = b["us"]
        s = base.get((f["n_q"], f["n_kv"], f["T"], f["batch"]))
        s_txt = f"{s:.1f}" if s else "–"
        ratio = f"{s / us:.2f}" if s else "–"
        print(f"| {shape} | {f['T']} | {f['batch']} | {label} | {us:.1f} | {b['GB/s']:.0f} | "
              f"{b['of_peak']:.3f} | {b['of_copy']:.3f} | {s_txt} | {ratio} |")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "sdpa":
        sys.exit(sdpa(sys.argv[2]))
    if len(sys.argv) in (3, 4) and sys.argv[1] == "table":
        sys.exit(table(sys.argv[2], sys.argv[3] if len(sys.argv) == 4 else None))
    print(__doc__, file=sys.stderr)
    sys.exit(2)
