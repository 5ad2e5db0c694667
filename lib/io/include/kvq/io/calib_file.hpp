#pragma once
// The calibration file (.kvqcal.h5): provenance, fp64 moment sums, the calibration reservoir and
// the held-out windows. Layout: schemas/calibration-file.md. Frozen numbers below.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvq/corpus/corpus.hpp"
#include "kvq/format/decision.hpp"
#include "kvq/model/config.hpp"
#include "kvq/stats/moments.hpp"
#include "kvq/io/calib_versions.hpp"
#include "kvq/util/payload_memory.hpp"

namespace kvq {

struct CalibProvenance {
  std::string tool_version;
  std::string model_path;
  std::string model_config_sha256;
  std::string architecture;
  RopePairing pairing = RopePairing::kSplitHalf;
  int rotary_dim = 0;
  double rope_theta = 0.0;
  // The RoPE of the calibration windows (rope_params(cfg, seq_len)): every post-RoPE computation
  // downstream (Block-GTQ post-RoPE coding, kvq-verify's RoPE logits, kvq-eval, CUDA) uses it.
  std::string rope_type = "default";
  std::vector<double> rope_inv_freq;  // [rotary_dim / 2]
  double rope_attention_factor = 1.0;
  // Gemma 3 (version 7): the layers listed in rope_local_layers rotate with these frequencies and
  // factor instead (their local RoPE: the default one at rope_local_base_freq). Empty: every layer
  // uses rope_inv_freq.
  std::vector<double> rope_local_inv_freq;
  double rope_local_attention_factor = 1.0;
  std::vector<int> rope_local_layers;
  bool has_local_rope() const { return !rope_local_inv_freq.empty(); }
  bool local_rope(int layer) const;
  int head_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0;
  // MLA's served cache: a value dim unlike the key's and a logit scale other than 1/sqrt(head_dim)
  // (version 5; absent in older files and whenever they are the defaults, so those keep their bytes).
  int head_dim_v = 0;          // 0: head_dim
  double softmax_scale = 0.0;  // 0: 1/sqrt(head_dim)
  int v_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  double attn_scale() const;   // softmax_scale, else 1/sqrt(head_dim): every softmax over q.k uses it
  // True when the file needs version 5 (a value dim or a scale of its own).
  bool has_kv_dims() const { return v_dim() != head_dim || softmax_scale > 0.0; }
  std::vector<int> gqa_map;  // query head -> KV head
  // Attention window per layer (0 = full causal; W > 0: query t sees keys t-W < j <= t). Empty = all
  // full (files written before it was recorded).
  std::vector<int> layer_window;
  int window_of(int layer) const { return layer_window.empty() ? 0 : layer_window[size_t(layer)]; }
  // Attention sinks (gpt-oss; version 6): [n_layers][n_heads], query head h's softmax at layer l is
  // exp(z_j) / (Σ_j exp(z_j) + exp(attention_sinks[l][h])) — the sink has no value. Empty: none.
  std::vector<std::vector<double>> attention_sinks;
  bool has_sinks() const { return !attention_sinks.empty(); }
  // The sink of query head h at layer l, or -infinity (no sink: the plain softmax).
  double sink_of(int layer, int head) const;
  // Hybrid decoders (Qwen3.5; version 8): the file's layers are the model's layers with a KV cache,
  // and decoder_layers[l] is KV layer l's index among the n_decoder_layers decoder layers (the
  // others, Gated DeltaNet, keep a fixed-size state: nothing of them is captured or allocated).
  // Empty / 0: KV layer l is decoder layer l (every other file).
  std::vector<int> decoder_layers;
  int n_decoder_layers = 0;
  bool hybrid() const { return !decoder_layers.empty(); }
  int decoder_index(int layer) const { return hybrid() ? decoder_layers[size_t(layer)] : layer; }
  int decoder_layer_count() const { return hybrid() ? n_decoder_layers : n_layers; }
  std::vector<CorpusFile> corpus;
  std::string tokenizer_path, tokenizer_sha256;
  // How special-token strings in the corpus were encoded ("special": as their ids, as HF does;
  // "text": as plain text) and how many were matched; whether each window starts with BOS (false:
  // the tokenizer adds none, e.g. Qwen, and a window is seq_len corpus tokens). Absent in older
  // files: "special", 0, true.
  std::string special_tokens_mode = "special";
  int64_t special_tokens_matched = 0;
  bool window_bos = true;
  // The ids every window starts with (Tokenizer::prefix_ids(): Llama [BOS], Qwen none, GLM-4
  // [gMASK] <sop>); a window is these + seq_len - |prefix| corpus tokens. Absent in older files:
  // their windows start with the model's BOS when window_bos, with nothing otherwise.
  std::optional<std::vector<int>> window_prefix;
  size_t window_prefix_size() const { return window_prefix ? window_prefix->size() : window_bos ? 1 : 0; }
  // The recorded prefix; for an older file [model_bos_id] or [] (what calib-capture used then).
  std::vector<int> window_prefix_or(int model_bos_id) const {
    if (window_prefix) return *window_prefix;
    return window_bos ? std::vector<int>{model_bos_id} : std::vector<int>{};
  }
  uint64_t seed = 0;
  int samples = 0;      // calibration windows planned
  int holdout = 0;      // held-out windows
  int seq_len = 0;
  int batch_size = 0;   // windows per forward batch; fixed so a resumed run reduces identically
  int reservoir_tokens = 0;
  std::string dtype = "float32";  // activations as captured
  // The forward's arithmetic (calib-capture --precision): "fp32" or "bf16". Written only when bf16,
  // so an fp32 capture keeps today's bytes; absent (older files, fp32 captures) reads as "fp32".
  std::string forward_precision = "fp32";
  int64_t n_tokens_corpus = 0;
  int n_ranks = 1;
  int64_t created_unix = 0;  // from SOURCE_DATE_EPOCH when set; excluded from content digests
};

// Uniform sample of calibration token rows (Algorithm R over tokens in window order).
struct Reservoir {
  int64_t capacity = 0;
  int64_t seen = 0;                      // tokens offered so far
  std::array<uint64_t, 4> rng_state{};   // generator state, so a resume continues the draw
  std::vector<int64_t> source;           // [n][2]: (calibration window index, position)
  payload::FloatVector q, k, v;          // [n][L][n_heads|n_kv_heads][d] (v: the value dim)
  int64_t size() const { return int64_t(source.size() / 2); }
};

struct Holdout {
  std::vector<int64_t> ids;        // [M][T]
  std::vector<int64_t> positions;  // [T]
  payload::FloatVector q, k, v;    // [L][M][T][n_heads|n_kv_heads][d], pre-RoPE (v: the value dim)
  int windows = 0;
};

struct CalibFile {
  int64_t format_version = kCalibAttrProvenanceVersion;  // as read; written at 3, 4 for a large provenance, 5 for kv dims
  CalibProvenance prov;
  Moments moments;
  std::vector<int64_t> calib_offsets;    // token-stream offsets of the calibration windows
  std::vector<int64_t> holdout_offsets;
  int64_t windows_done = 0;              // calibration windows folded into `moments`
  Reservoir reservoir;
  Holdout holdout;
  std::vector<int64_t> window_rank;      // rank that processed each calibration window (MPI)

  MomentShape shape() const { return moments.shape(); }
  bool complete() const { return windows_done == int64_t(calib_offsets.size()); }
};

// A side's row dim: head_dim for K, the value dim for V (they differ for MLA's served cache).
inline int side_dim(const MomentShape& s, Side side) { return side == Side::kV ? s.v_dim() : s.head_dim; }
inline int side_dim(const CalibProvenance& p, Side side) { return side == Side::kV ? p.v_dim() : p.head_dim; }

// Turns on amax tracking in `m` with the RoPE the provenance records (the windows' own).
inline void track_amax_with(Moments& m, const CalibProvenance& p) {
  m.set_amax_rope(p.pairing, p.rotary_dim, p.rope_inv_freq, p.rope_attention_factor);
  if (p.has_local_rope()) m.set_amax_rope_local(p.rope_local_inv_freq, p.rope_local_attention_factor, p.rope_local_layers);
}

// Atomic write (tmp + fsync + rename).
void write_calib(const std::string& path, const CalibFile& c);
// Reads and validates (format, version, shapes, finiteness). `samples` false skips the reservoir
// and holdout payloads (allocators need only the sums).
CalibFile read_calib(const std::string& path, bool samples = true);

// sha256 over the statistics and provenance minus the timestamp: identifies the content.
std::string calib_content_digest(const CalibFile& c);

std::string provenance_to_json(const CalibProvenance& p);
// `where`: the object the text came from, for the "not valid JSON" message.
CalibProvenance provenance_from_json(const std::string& file, const std::string& json,
                                     const std::string& where = "/@provenance");

}  // namespace kvq
