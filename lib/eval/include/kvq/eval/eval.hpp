#pragma once
// kvq-eval's work: perplexity of a model on held-out text with its KV cache coded by an allocation
// (the real codec, inside the forward), beside the fp32 forward and a uniform TQ-MSE baseline at the
// same nominal budget.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "kvq/eval/perplexity.hpp"

namespace kvq {

struct EvalOptions {
  std::string model, alloc, tokenizer;
  std::vector<std::string> text;  // files or folders (read like a corpus)
  bool lossy_utf8 = false;
  std::string calib;              // optional: refuse text that overlaps its calibration windows
  std::string baseline = "uniform";  // uniform | none
  double baseline_k_bpd = 0;      // 0: the allocation's nominal K budget (must be whole bits)
  double baseline_v_bpd = 0;
  // nominal: the baseline codes at the allocation's nominal bits (or the explicit ones above);
  // effective: per side the whole bits (1..8) with the smallest effective bpd (packed layout, side
  // information included) >= the allocation's, the widest of those (alloc::match_effective_bits). With explicit baseline bits: a usage error.
  std::string match = "nominal";
  // true: the checkpoint stays mapped and every window's forward converts one layer at a time
  // (for models whose fp32 weights do not fit; each window pays the conversion once).
  bool stream = false;
  int window = 0;                 // 0: the model's maximum sequence length
  int stride = 0;                 // 0: window / 2
  CachePolicy policy;
  int64_t max_tokens = 0;         // > 0: score only the first max_tokens text tokens
  bool quiet = false;
  // Coded rows also report the end-to-end KL against the fp32 forward (kl_vs_fp32; one more forward
  // per batch): the unit the sensitivity issue's allocators and gates use.
  bool kl = true;
  Precision precision = Precision::kFp32;  // both forwards' arithmetic (kvq-eval: default_precision())
};

struct EvalRow {
  std::string name;               // "fp32", the allocation's method, "uniform"
  bool coded = false;
  double k_bpd_nominal = 32, k_bpd_effective = 32, v_bpd_nominal = 32, v_bpd_effective = 32;
  PplResult result;
};

struct EvalReport {
  std::string model, alloc, text, calib;
  int64_t text_tokens = 0;
  int window = 0, stride = 0;
  CachePolicy policy;
  std::string overlap;            // what the held-out check did
  std::string match = "nominal";  // how the baseline's budget was chosen (EvalOptions::match)
  std::string forward_precision = "fp32";  // both forwards' arithmetic; in the JSON only when "bf16"
  std::vector<EvalRow> rows;      // fp32, allocation, baseline (when asked)
  nlohmann::json to_json() const;
};

EvalReport run_eval(const EvalOptions& o);

// The table users read (stdout).
std::string format_eval_report(const EvalReport& r);

}  // namespace kvq
