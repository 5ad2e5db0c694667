// kvq-eval's KvCoder on MLA's served cache: K rows of 576 dims and V rows of 512 (LayerKv's
// v_dim()), one KV head per layer. Each row coded in place must equal that row coded alone by a
// HeadCodec of its side's dim (a second path, without the coder's strides); a V decision made for
// the key's dim is refused.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kvq/alloc/uniform.hpp"
#include "kvq/codec/codec.hpp"
#include "kvq/eval/kv_coder.hpp"
#include "kvq/util/error.hpp"

using namespace kvq;

namespace {

ModelConfig mla_config() {
  ModelConfig cfg;
  cfg.n_layers = 2;
  cfg.n_heads = 16;
  cfg.n_kv_heads = 1;
  cfg.head_dim = 576;
  cfg.head_dim_v = 512;
  cfg.rotary_dim = 64;
  cfg.pairing = RopePairing::kInterleaved;
  return cfg;
}

std::vector<HeadDecision> uniform_heads(const ModelConfig& cfg, int k_dim, int v_dim) {
  std::vector<HeadDecision> heads;
  for (auto [side, d, bits] : {std::make_tuple(Side::kK, k_dim, 3), std::make_tuple(Side::kV, v_dim, 2)}) {
    auto a = alloc::allocate_uniform(alloc::Shape{cfg.n_layers, cfg.n_kv_heads, d}, side, bits);
    heads.insert(heads.end(), a.heads.begin(), a.heads.end());
  }
  return heads;
}

}  // namespace

TEST(KvCoderDims, KAndVRowsAreCodedAtTheirOwnDims) {
  const ModelConfig cfg = mla_config();
  const std::vector<HeadDecision> heads = uniform_heads(cfg, 576, 512);
  const KvCoder coder(cfg, heads, "a.kvqalloc.h5");
  const int n = 5;
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> k(size_t(n) * 576), v(size_t(n) * 512);
  for (float& x : k) x = g(rng);
  for (float& x : v) x = g(rng);
  const std::vector<float> k0 = k, v0 = v;
  std::vector<int64_t> pos(n);
  for (int t = 0; t < n; ++t) pos[size_t(t)] = t;
  coder.code(1, k.data(), v.data(), n, pos.data());
  for (const HeadDecision& h : heads) {
    if (h.layer != 1) continue;
    const int d = h.side == Side::kK ? 576 : 512;
    const codec::HeadCodec c(h, d);
    const std::vector<float>& x0 = h.side == Side::kK ? k0 : v0;
    const std::vector<float>& got = h.side == Side::kK ? k : v;
    for (int t = 0; t < n; ++t) {
      std::vector<float> y(static_cast<size_t>(d));
      c.round_trip(x0.data() + size_t(t) * d, 1, y.data());
      for (int i = 0; i < d; ++i) ASSERT_EQ(got[size_t(t) * d + i], y[size_t(i)]) << int(h.side) << " t " << t << " i " << i;
    }
  }
  // Negative control: the rows did change (2 and 3 bits are lossy).
  EXPECT_NE(k, k0);
  EXPECT_NE(v, v0);
  EXPECT_NEAR(coder.v_bpd_effective(), codec::HeadCodec(heads.back(), 512).effective_bpd(), 1e-12);
}

TEST(KvCoderDims, AVDecisionForTheKeysDimIsRefused) {
  const ModelConfig cfg = mla_config();
  try {
    KvCoder coder(cfg, uniform_heads(cfg, 576, 576), "a.kvqalloc.h5");
    FAIL() << "accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}
