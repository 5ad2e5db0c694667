#pragma once
// The real codec applied to K/V as the forward writes them: one HeadCodec per (layer, KV head,
// side), quantize -> dequantize of pre-RoPE rows. Decisions with post_rope (Block-GTQ K) are coded
// where they were allocated: rotated to their position with the model's RoPE, coded, rotated back.
#include <string>
#include <vector>

#include "kvq/format/decision.hpp"
#include "kvq/codec/codec.hpp"
#include "kvq/model/config.hpp"

namespace kvq {

class KvCoder {
 public:
  // Needs exactly one decision per (layer, KV head, side) of the model's shape; anything else, and
  // codings whose value depends on other tokens (KIVI groups tokens), throws kvq::Error naming
  // `source` (the allocation file) and the head.
  KvCoder(const ModelConfig& cfg, const std::vector<HeadDecision>& heads, const std::string& source);

  // Codes n tokens of one layer in place. k is [n][n_kv_heads][head_dim] pre-RoPE, v
  // [n][n_kv_heads][v_dim()] (the LayerKv row layout); token t sits at positions[t]. Each token is coded on its own, so coding a
  // window at once equals coding each token once when it is written to a cache.
  void code(int layer, float* k, float* v, int n, const int64_t* positions) const;

  // Mean over heads of the codec's stored bits per token per head / d (codes + norms + scales).
  double k_bpd_effective() const { return k_bpd_eff_; }
  double v_bpd_effective() const { return v_bpd_eff_; }
  const ModelConfig& config() const { return cfg_; }

 private:
  const codec::HeadCodec& codec(Side s, int layer, int head) const;
  ModelConfig cfg_;
  std::vector<codec::HeadCodec> codecs_;  // [side][layer][head]
  double k_bpd_eff_ = 0, v_bpd_eff_ = 0;
};

}  // namespace kvq
