#pragma once
// Model hyper-parameters as read from config.json or a llama2.c header. No LibTorch here: the
// statistics, allocation and codec libraries use this header without linking the forward.
#include <cstdint>
#include <string>
#include <vector>

namespace kvq {

// Written to disk (calibration and allocation files): never renumber.
enum class RopePairing : uint32_t {
  kInterleaved = 0,  // block i = coords (2i, 2i+1)       — Meta / llama2.c
  kSplitHalf = 1,    // block i = coords (i, i + d_r/2)   — HF rotate_half
};
const char* to_string(RopePairing p);
RopePairing rope_pairing_from_string(const std::string& s);  // throws kvq::Error

struct ModelConfig {
  std::string architecture;  // "llama", "mistral", "qwen2" (HF model_type) or "llama2c"
  int hidden_size = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int intermediate_size = 0;
  int vocab_size = 0;
  int max_seq_len = 0;
  double rope_theta = 10000.0;
  int rotary_dim = 0;  // d_r <= head_dim (partial rotary); dims >= d_r are not rotated
  RopePairing pairing = RopePairing::kSplitHalf;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2; Llama with attention_bias
  bool o_bias = false;    // Llama with attention_bias
  int sliding_window = 0;  // > 0: attention window of the checkpoint; longer windows are refused
  int bos_id = 1;
  int eos_id = 2;

  int group_size() const { return n_heads / n_kv_heads; }
  int kv_head_of(int query_head) const { return query_head / group_size(); }
  int n_rope_blocks() const { return head_dim / 2; }  // includes theta=0 pairs past d_r
};

// Coordinates (a, b) of RoPE block i for a head of dimension d with rotary dim d_r. Blocks at or
// past d_r/2 are the unrotated tail, paired in the same convention over the tail dims.
inline void rope_block_coords(RopePairing p, int d, int d_r, int i, int* a, int* b) {
  int nr = d_r / 2;
  if (i < nr) {
    if (p == RopePairing::kInterleaved) { *a = 2 * i; *b = 2 * i + 1; }
    else { *a = i; *b = i + nr; }
  } else {
    int j = i - nr, tail = d - d_r, nt = tail / 2;
    if (p == RopePairing::kInterleaved) { *a = d_r + 2 * j; *b = d_r + 2 * j + 1; }
    else { *a = d_r + j; *b = d_r + j + nt; }
  }
}

}  // namespace kvq
