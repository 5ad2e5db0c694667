#pragma once
// Perplexity with the KV cache quantized by the real codec inside the forward.
//
// Cache semantics: every token's K and V are coded once, when the token is written to the cache,
// and every later query reads that coded value. The forward is a full causal window, so for a plain
// quantized cache this is exactly "code every position of every layer once" (the codecs are
// per-token). Positions are window-relative (each window is a fresh sequence from position 0).
//
// Protected tokens (CachePolicy): for query i, key/value j (j <= i) is read in full precision when
// j < sink or j > i - recent (the last `recent` cache entries, the query's own token included),
// coded otherwise. "Recent" depends on the query, so no single K per position is right for every
// query; the forward keeps both the full and the coded K/V and each (query, key) pair of the
// attention reads the side the policy names (Model::ForwardOptions::protected_kv). That is exactly
// the mixed cache a decode loop would hold, at the cost of one forward per window.
#include <cstdint>
#include <string>
#include <vector>

#include "kvq/eval/kv_coder.hpp"
#include "kvq/model/model.hpp"

namespace kvq {

struct CachePolicy {
  int sink = 0;    // first `sink` positions of the window stay full precision
  int recent = 0;  // the last `recent` cache entries (relative to each query) stay full precision
};

// NLL (nats) of each target ids[t], t in [first_target, ids.size()), predicted from ids[0..t).
// ids[0] is usually BOS. coder == nullptr: the fp32 forward.
std::vector<double> window_token_nll(const Model& m, const std::vector<int64_t>& ids, int first_target,
                                     const KvCoder* coder, const CachePolicy& policy = {});

struct PplOptions {
  int window = 0;      // tokens per forward, prefix included (2..max_seq_len)
  int stride = 0;      // new tokens per window (1..window - max(1, |prefix|))
  // What every window starts with (Tokenizer::prefix_ids(): Llama [BOS], GLM-4 [gMASK] <sop>).
  // Empty (Qwen): the text's first token has no context and is not scored.
  std::vector<int> prefix{1};
  CachePolicy policy;
  int64_t max_batch_tokens = 16384;  // windows per forward = this / window
  bool quiet = false;                // no progress line
  std::string label;                 // progress label
  // With a coder: also run each batch unquantized and sum KL(p_fp32 || p_coded) of the next-token
  // distributions over the scored tokens (PplResult::kl: the end-to-end KL, one more forward per
  // batch).
  bool kl = false;
};

struct PplResult {
  double nll_sum = 0;        // nats over all scored tokens
  int64_t tokens = 0;        // scored tokens (= text tokens: each is scored exactly once)
  int64_t windows = 0;
  int64_t forward_tokens = 0;  // tokens pushed through the forward: each window's once, any policy
  int64_t forwards = 0;        // Model::forward calls (batches of windows)
  double seconds = 0;
  double kl_sum = 0;          // nats over the scored tokens (PplOptions::kl with a coder: has_kl)
  bool has_kl = false;
  double nll() const { return tokens ? nll_sum / double(tokens) : 0.0; }
  double kl() const { return tokens ? kl_sum / double(tokens) : 0.0; }
  double ppl() const;
};

// Sliding windows like the standard perplexity scripts: window k is prefix + text[k*stride ..
// k*stride + window - |prefix|); each text token is scored once, in the first window that contains
// it beyond the previous window's end, with the context that precedes it in that window.
// `text` is the token stream without the prefix.
PplResult sliding_perplexity(const Model& m, const std::vector<int32_t>& text, const PplOptions& o,
                             const KvCoder* coder);

}  // namespace kvq
