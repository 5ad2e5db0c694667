#include "kvq/eval/kv_coder.hpp"

#include <ATen/Parallel.h>

#include <algorithm>

#include "kvq/model/model.hpp"
#include "kvq/util/error.hpp"

namespace kvq {

namespace {
const char* side_name(Side s) { return s == Side::kK ? "K" : "V"; }
}  // namespace

KvCoder::KvCoder(const ModelConfig& cfg, const std::vector<HeadDecision>& heads, const std::string& source)
    : cfg_(cfg) {
  const int L = cfg.n_layers, H = cfg.n_kv_heads, d = cfg.head_dim, dv = cfg.v_dim();
  std::vector<const HeadDecision*> slot(size_t(2) * L * H, nullptr);
  for (const auto& h : heads) {
    const std::string where = std::string(side_name(h.side)) + " layer " + std::to_string(h.layer) + " head " +
                              std::to_string(h.kv_head);
    if ((h.side != Side::kK && h.side != Side::kV) || h.layer < 0 || h.layer >= L || h.kv_head < 0 || h.kv_head >= H)
      throw Error(source, "heads", where + " is outside the model's " + std::to_string(L) + " layers x " +
                                       std::to_string(H) + " KV heads");
    auto& s = slot[(size_t(h.side) * L + size_t(h.layer)) * H + size_t(h.kv_head)];
    if (s) throw Error(source, "heads", where + " has two decisions");
    if (h.kind == CodingKind::kKivi)
      throw Error(source, "heads", where + " is KIVI-coded: it quantizes groups of tokens together, which has no "
                                           "per-token cache semantics (kvq-eval codes each token once)");
    s = &h;
  }
  codecs_.reserve(slot.size());
  for (size_t i = 0; i < slot.size(); ++i) {
    if (!slot[i]) {
      const int side = int(i / (size_t(L) * H)), l = int(i / H) % L, h = int(i % H);
      throw Error(source, "heads", std::string("no decision for ") + side_name(Side(side)) + " layer " +
                                       std::to_string(l) + " head " + std::to_string(h) + " of the model");
    }
    const bool k_side = i < size_t(L) * H;
    codecs_.emplace_back(*slot[i], k_side ? d : dv);  // validates the decision against the side's dim
    (k_side ? k_bpd_eff_ : v_bpd_eff_) += codecs_.back().effective_bpd() / (double(L) * H);
  }
}

const codec::HeadCodec& KvCoder::codec(Side s, int layer, int head) const {
  return codecs_[(size_t(s) * cfg_.n_layers + size_t(layer)) * cfg_.n_kv_heads + size_t(head)];
}

void KvCoder::code(int layer, float* k, float* v, int n, const int64_t* positions) const {
  KVQ_ASSERT(layer >= 0 && layer < cfg_.n_layers);
  if (n <= 0) return;
  const int H = cfg_.n_kv_heads, dk = cfg_.head_dim, dv = cfg_.v_dim();
  // Tasks = (side, head, block of tokens): the codecs are per-token, so blocks are independent.
  constexpr int kBlock = 64;
  const int blocks = (n + kBlock - 1) / kBlock;
  const int64_t tasks = int64_t(2) * H * blocks;
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> x, y;
    for (int64_t task = begin; task < end; ++task) {
      const int blk = int(task % blocks), h = int(task / blocks) % H;
      const Side side = task / (int64_t(blocks) * H) == 0 ? Side::kK : Side::kV;
      const int t0 = blk * kBlock, m = std::min(kBlock, n - t0);
      const int d = side == Side::kK ? dk : dv;  // V rows at the value dim (MLA)
      const size_t row = size_t(H) * size_t(d);
      float* base = (side == Side::kK ? k : v) + size_t(t0) * row + size_t(h) * d;
      const codec::HeadCodec& c = codec(side, layer, h);
      x.resize(size_t(m) * d);
      y.resize(x.size());
      for (int t = 0; t < m; ++t) std::copy_n(base + size_t(t) * row, d, x.data() + size_t(t) * d);
      const bool post = side == Side::kK && c.decision().post_rope;
      // The forward's RoPE length is its last position + 1 (only `dynamic` RoPE depends on it).
      if (post) apply_rope(x.data(), 1, m, d, positions + t0, cfg_, false, positions[n - 1] + 1, layer);
      c.round_trip(x.data(), m, y.data());
      if (post) apply_rope(y.data(), 1, m, d, positions + t0, cfg_, true, positions[n - 1] + 1, layer);
      for (int t = 0; t < m; ++t) std::copy_n(y.data() + size_t(t) * d, d, base + size_t(t) * row);
    }
  });
}

}  // namespace kvq
