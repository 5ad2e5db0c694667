#pragma once
// kvq-verify's work: code the held-out windows of a calibration file with an allocation (and a
// baseline at the same nominal budget), decode with the CPU reference (and CUDA when present), and
// measure what the model's attention would see.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "kvq/format/decision.hpp"

namespace kvq {

struct VerifyOptions {
  std::string calib, alloc;
  std::string baseline = "uniform";  // uniform | kivi
  double baseline_k_bpd = 0;         // 0: the allocation's nominal K budget (whole bits)
  double baseline_v_bpd = 0;         // 0: the allocation's nominal V budget
  // nominal: the baseline codes at the allocation's nominal bits (or the explicit ones above);
  // effective: per side, the smallest whole-bit baseline budget whose effective bpd (packed layout,
  // side information included) is >= the allocation's (match_effective_bits). With explicit
  // baseline bits: a usage error.
  std::string match = "nominal";
  bool cuda = true;                  // check the GPU encoder, decoder and attention against the CPU when a GPU is there
  // Gates (negative = off). Overall figures, or layer counts.
  double max_logit_mae = -1, max_kl = -1, min_top10 = -1, max_nmse_k = -1, max_nmse_v = -1;
  int min_layer_wins = -1;
};

struct Metrics {
  // Every figure but NMSE counts only the (query, key) pairs the model attends: causal, and within
  // the layer's sliding window (provenance layer_window) when it has one.
  // |q.k - q.k^| * scale (the recorded softmax_scale, MLA's; else 1/sqrt(d)), attended pairs,
  // post-RoPE, true positions
  double logit_mae = 0;
  double kl = 0;          // softmax KL(p || p~) per query, mean
  double top10 = 0;       // |top10(p) ∩ top10(p~)| / min(10, keys), mean over queries
  double nmse_k = 0;      // sum |k - k^|^2 / sum |k|^2
  double nmse_v = 0;
  double out_rel_err = 0; // |P V - P~ V^|^2 / |P V|^2, attention output with both K^ and V^ (V at its own dim)
};

struct CodedReport {
  std::string name;
  double k_bpd_nominal = 0, k_bpd_effective = 0, v_bpd_nominal = 0, v_bpd_effective = 0;
  std::vector<Metrics> layers;
  Metrics overall;  // mean over layers
};

// kvq-verify on the GPU path (VerifyOptions::cuda, with a device): every (layer, KV head, side) of
// the allocation over the held-out windows through the GPU encoder and decoder, and per (layer,
// window) the fused decode attention of the window's last query over the GPU-coded cache, against
// the CPU reference. Without a GPU ran = false and every figure is 0.
struct GpuCheck {
  // Stated tolerances: decoded values |gpu - cpu| <= kDecodeTolerance * (1 + ||x_t||) per element
  // (summation order differs); attention outputs |gpu - cpu| <= kAttentionTolerance * (1 + max
  // |out|) (float accumulation and softmax vs the CPU's double). Codes: exactly equal.
  static constexpr double kDecodeTolerance = 2e-5;
  static constexpr double kAttentionTolerance = 2e-4;
  bool ran = false;
  std::string skipped;                       // why a present GPU was not used (head dims over its limit); "" otherwise
  std::string device;                        // the GPU's name
  int64_t k_head_windows = 0, v_head_windows = 0;  // (layer, KV head, window) checked per side
  int64_t tokens = 0;                        // token rows encoded on the GPU, both sides
  int64_t byte_mismatches = 0;               // packed bytes GPU != CPU encoder (records included)
  int64_t code_mismatches = 0;               // integer codes GPU != CPU encoder
  double max_abs_diff = 0;                   // max |GPU decode of GPU codes - CPU decode of CPU codes|
  double max_scaled_diff = 0;                // the same over (1 + ||x_t||): the tolerance's measure
  // The serving path: each layer as a GPU-resident packed cache (one sequence per window) filled
  // one decode step at a time through the GPU encoder, the fused attention at steps 1, 2, 4, ...
  // and the last (verify_gpu.hpp).
  int64_t cache_layers = 0;                  // layers run as a cache
  int64_t cache_steps = 0;                   // (window, token) appends, all layers
  int64_t cache_byte_mismatches = 0;         // the cache's bytes after the last step vs the CPU encoder's
  int64_t cache_code_mismatches = 0;         // the same in integer codes
  int64_t cache_length_errors = 0;           // sequences whose length is not the tokens appended
  int64_t attention_problems = 0;            // (layer, window, step) fused-attention queries run
  double attention_max_abs_diff = 0;         // max |GPU - CPU| attention output
  double attention_max_scaled_diff = 0;      // the same over (1 + max |out|)
  std::vector<std::string> notes;            // layers the cache check could not take, and why
  bool passed() const {
    return !ran || (byte_mismatches == 0 && code_mismatches == 0 && max_scaled_diff <= kDecodeTolerance &&
                    cache_byte_mismatches == 0 && cache_code_mismatches == 0 && cache_length_errors == 0 &&
                    attention_max_scaled_diff <= kAttentionTolerance);
  }
  nlohmann::json to_json() const;
  std::string summary() const;  // one line for the text report
};

struct VerifyReport {
  CodedReport alloc, baseline;
  std::string match = "nominal";  // how the baseline's budget was chosen (VerifyOptions::match)
  int layer_wins = 0;  // layers where the allocation's logit MAE < the baseline's
  int n_layers = 0;
  std::string cuda;    // "not available", or agreement figures (GpuCheck::summary)
  GpuCheck gpu;        // the same in figures (JSON "gpu")
  std::vector<std::string> failed_gates;
  nlohmann::json to_json() const;
};

VerifyReport run_verify(const VerifyOptions& o);

// --match effective: the smallest whole number of bits b in 1..8 at which the `kind` baseline
// (alloc::baseline_heads) of `shape` has a mean effective bpd on `side` >= target (within 1e-9).
// None reaches it: kvq::Error naming --match, the side, target and the baseline's largest.
int match_effective_bits(const std::string& kind, int n_layers, int n_kv_heads, int head_dim, Side side,
                         double target, bool norm_correction);

// The per-layer table users read (stdout).
std::string format_report(const VerifyReport& r);

}  // namespace kvq
