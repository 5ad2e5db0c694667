#pragma once
// The end-to-end probe (issue 35, first part): what coding one layer's KV cache does to the model's
// output. For each layer l and each candidate coding (a KvCoder: its decisions for layer l are the
// candidate; its other layers are not read), the windows' forward with only layer l's K and V
// coded by the real codec, against the unquantized forward:
//   kl   = the mean over every scored position of KL(p || p^) of the next-token distributions
//          (p from the unquantized forward, p^ with layer l coded; natural log, in double);
//   dnll = the mean over the same positions of NLL^(next token) - NLL(next token).
// Scored positions: 0 .. T - 2 of every window (those with a next token). The unquantized forward's
// residual stream at every layer's input is kept per batch of windows (Model::forward_chunk), so
// the probe of layer l runs layers l.. only (Model::forward_from): for L layers and S candidates,
// S * L * (L + 1) / 2 layer forwards besides the clean one, instead of S * L * L. Works on a
// streamed model (each probe forward converts the layers it runs).
#include <cstdint>
#include <string>
#include <vector>

#include "kvq/eval/kv_coder.hpp"
#include "kvq/model/model.hpp"

namespace kvq {

struct ProbeOptions {
  int64_t max_batch_tokens = 8192;  // windows per batch = max(1, this / T)
  bool quiet = false;               // no plan line and no progress
  std::string label = "probe";
};

struct ProbeResult {
  int n_layers = 0, n_settings = 0;
  std::vector<double> kl, dnll;  // [setting * n_layers + layer]
  double clean_nll = 0;          // mean NLL of the unquantized forward over the scored positions
  int64_t windows = 0, positions = 0;
  int64_t layer_forwards = 0;    // layers run, the clean forward's included
  double seconds = 0;
  double kl_at(int s, int l) const { return kl[size_t(s) * size_t(n_layers) + size_t(l)]; }
  double dnll_at(int s, int l) const { return dnll[size_t(s) * size_t(n_layers) + size_t(l)]; }
};

// windows: token ids, every window the same length T >= 2 (the prefix included), positions 0..T-1.
// layers: the layers to probe (empty: all); the result's other entries stay 0. Throws kvq::Error on
// empty or ragged windows or a coder of another shape.
ProbeResult probe_layers(const Model& m, const std::vector<std::vector<int64_t>>& windows,
                         const std::vector<const KvCoder*>& settings, const ProbeOptions& o = {},
                         const std::vector<int>& layers = {});

// The whole allocation at once (every layer coded by `coder`), the same figures: what the isolated
// probes add up to when the errors do not interact (additivity ratio = composite / sum of probes).
struct CompositeResult {
  double kl = 0, dnll = 0, clean_nll = 0;
  int64_t positions = 0;
};
CompositeResult probe_composite(const Model& m, const std::vector<std::vector<int64_t>>& windows, const KvCoder& coder,
                                const ProbeOptions& o = {});

}  // namespace kvq

#include "kvq/io/probe_file.hpp"

namespace kvq {

// kvq-probe: the probe of a family of candidate codings on the first `windows` calibration windows
// of `calib` (re-read from its recorded corpus, as calib-capture tokenized it), on `model` (the one
// the calibration was made from). candidates "vllm-turboquant": vLLM's four presets (keys post-RoPE,
// coding kind vllm-turboquant) and the layer kept in BF16; "allocation": the allocation `alloc`
// (made from this calibration) layer by layer and as a whole (ProbeFile::composite_kl: the
// additivity of its layers' errors).
struct ProbeRunOptions {
  std::string model, calib, alloc;
  std::string candidates = "vllm-turboquant";
  int windows = 16;
  bool stream = false;
  bool quiet = false;
  int64_t max_batch_tokens = 8192;
  Precision precision = Precision::kFp32;  // the forwards' arithmetic (kvq-probe: default_precision())
};
ProbeFile run_probe(const ProbeRunOptions& o);

}  // namespace kvq
