// Perplexity with a coded KV cache, against a decode loop written the obvious way: one token per
// step, the cache of earlier tokens handed to the forward as a decode loop would hold it. The fast
// paths (one forward per window, the protected cache's per-pair selection included) must give the
// same NLL.
#include <gtest/gtest.h>

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kvq/alloc/uniform.hpp"
#include "kvq/codec/attention.hpp"
#include "kvq/eval/generate.hpp"
#include "kvq/eval/kv_coder.hpp"
#include "kvq/eval/perplexity.hpp"
#include "kvq/tokenizer/tokenizer.hpp"
#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"

using namespace kvq;

namespace {

const std::string kDemo = std::string(KVQ_SOURCE_DIR) + "/data/kvq-demo-llama";

const Model& demo() {
  static Model m = Model::load(kDemo);
  return m;
}

// [BOS] + the first n-1 tokens of psalm23.txt.
std::vector<int64_t> psalm_ids(int n) {
  auto tok = Tokenizer::load(kDemo + "/tokenizer.model");
  std::vector<int64_t> ids{tok->bos_id()};
  for (int t : tok->encode(read_file(kDemo + "/psalm23.txt"))) {
    if (int(ids.size()) == n) break;
    ids.push_back(t);
  }
  return ids;
}

std::vector<HeadDecision> uniform(const ModelConfig& c, int k_bits, int v_bits, bool k_post_rope = false) {
  alloc::Shape s{c.n_layers, c.n_kv_heads, c.head_dim};
  alloc::UniformOptions o;
  o.post_rope = k_post_rope;
  auto k = alloc::allocate_uniform(s, Side::kK, k_bits, o).heads;
  auto v = alloc::allocate_uniform(s, Side::kV, v_bits, o).heads;
  k.insert(k.end(), v.begin(), v.end());
  return k;
}

// One decode step: forward over ids[0..i]; at each layer token i's K/V come fresh from this forward
// (its hidden state is right because every earlier layer saw the right cache), are stored in full
// precision and coded once; then every token j <= i is replaced by what the cache holds for query i.
class DecodeStep : public KvTransform {
 public:
  std::vector<std::vector<float>> K, V, Kq, Vq;  // [layer][token * row]
  const KvCoder* coder = nullptr;
  CachePolicy p;
  int i = 0;
  size_t row = 0;

  void apply(LayerKv& kv) override {
    const size_t l = size_t(kv.layer);
    ASSERT_EQ(kv.seq, i + 1);
    std::copy_n(kv.k + size_t(i) * row, row, K[l].begin() + long(size_t(i) * row));
    std::copy_n(kv.v + size_t(i) * row, row, V[l].begin() + long(size_t(i) * row));
    std::vector<float> kq(kv.k + size_t(i) * row, kv.k + size_t(i + 1) * row);
    std::vector<float> vq(kv.v + size_t(i) * row, kv.v + size_t(i + 1) * row);
    const int64_t pos = i;
    if (i >= p.sink) coder->code(kv.layer, kq.data(), vq.data(), 1, &pos);
    std::copy(kq.begin(), kq.end(), Kq[l].begin() + long(size_t(i) * row));
    std::copy(vq.begin(), vq.end(), Vq[l].begin() + long(size_t(i) * row));
    for (int j = 0; j <= i; ++j) {
      const bool coded = j >= p.sink && j <= i - p.recent;
      std::copy_n((coded ? Kq : K)[l].begin() + long(size_t(j) * row), row, kv.k + size_t(j) * row);
      std::copy_n((coded ? Vq : V)[l].begin() + long(size_t(j) * row), row, kv.v + size_t(j) * row);
    }
  }
};

std::vector<double> decode_loop_nll(const Model& m, const std::vector<int64_t>& ids, const KvCoder& coder,
                                    CachePolicy p) {
  c10::InferenceMode guard;
  const auto& c = m.config();
  const int T = int(ids.size());
  DecodeStep st;
  st.coder = &coder;
  st.p = p;
  st.row = size_t(c.n_kv_heads) * size_t(c.head_dim);
  for (auto* x : {&st.K, &st.V, &st.Kq, &st.Vq}) x->assign(size_t(c.n_layers), std::vector<float>(T * st.row));
  std::vector<double> out;
  for (int i = 0; i + 1 < T; ++i) {
    st.i = i;
    Model::ForwardOptions fo;
    fo.kv_transform = &st;
    at::Tensor x = at::tensor(std::vector<int64_t>(ids.begin(), ids.begin() + i + 1), at::kLong);
    at::Tensor logits = m.forward(x, fo)[0][i].to(at::kDouble);
    out.push_back(-at::log_softmax(logits, 0)[ids[size_t(i) + 1]].item<double>());
  }
  return out;
}

double mean(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0) / double(v.size()); }

}  // namespace

// The two forwards differ in shape (one window vs a growing prefix), so their K/V differ by float
// rounding (GEMM blocking); at 2 bits a value that close to a quantizer boundary can take the
// neighbouring code in one of them; the flipped code stays in the cache, so every later token
// moves a little (seen on an AMD EPYC: 2.3e-2 at most, 10 tokens of 39 over 1e-4). So: the mean
// |difference| is below 3e-3 and none over 0.1, while a wrong cache rule (one position of the sink
// or the recent window coded when it should not be) moves the mean NLL by ~3e-2.
TEST(Perplexity, MatchesDecodeLoopForEveryCachePolicy) {
  const Model& m = demo();
  const auto ids = psalm_ids(40);
  KvCoder coder(m.config(), uniform(m.config(), 2, 2), "test");
  const auto fp = window_token_nll(m, ids, 1, nullptr);
  for (CachePolicy p : {CachePolicy{0, 0}, CachePolicy{0, 1}, CachePolicy{3, 0}, CachePolicy{2, 5},
                        CachePolicy{4, 16}, CachePolicy{0, 30}, CachePolicy{1, 25}}) {
    const auto ref = decode_loop_nll(m, ids, coder, p);
    const auto got = window_token_nll(m, ids, 1, &coder, p);
    ASSERT_EQ(ref.size(), got.size());
    double max_diff = 0, sum_diff = 0, moved = 0;
    for (size_t t = 0; t < ref.size(); ++t) {
      const double d = std::fabs(ref[t] - got[t]);
      max_diff = std::max(max_diff, d);
      sum_diff += d;
      moved = std::max(moved, std::fabs(ref[t] - fp[t]));
    }
    const double mean_diff = sum_diff / double(ref.size());
    EXPECT_LT(mean_diff, 3e-3) << "sink " << p.sink << " recent " << p.recent;
    EXPECT_LT(max_diff, 0.1) << "sink " << p.sink << " recent " << p.recent;
    EXPECT_GT(moved, 1e-3) << "sink " << p.sink << " recent " << p.recent << ": coding changed nothing";
    std::printf("sink %2d recent %2d: mean NLL %.5f (decode loop %.5f, fp32 %.5f), |diff| max %.2e mean %.2e\n",
                p.sink, p.recent, mean(got), mean(ref), mean(fp), max_diff, mean_diff);
  }
}

TEST(Perplexity, LaterFirstTargetScoresTheSameTokens) {
  const Model& m = demo();
  const auto ids = psalm_ids(40);
  KvCoder coder(m.config(), uniform(m.config(), 2, 2), "test");
  for (CachePolicy p : {CachePolicy{0, 0}, CachePolicy{4, 8}}) {
    const auto all = window_token_nll(m, ids, 1, &coder, p);
    const auto tail = window_token_nll(m, ids, 25, &coder, p);
    ASSERT_EQ(tail.size(), ids.size() - 25);
    for (size_t t = 0; t < tail.size(); ++t) EXPECT_NEAR(tail[t], all[t + 24], 1e-5);
  }
}

TEST(Perplexity, FullyProtectedCacheIsFp32) {
  const Model& m = demo();
  const auto ids = psalm_ids(40);
  KvCoder coder(m.config(), uniform(m.config(), 1, 1), "test");
  const auto fp = window_token_nll(m, ids, 1, nullptr);
  for (CachePolicy p : {CachePolicy{39, 0}, CachePolicy{0, 39}, CachePolicy{20, 19}}) {
    const auto got = window_token_nll(m, ids, 1, &coder, p);
    for (size_t t = 0; t < fp.size(); ++t) EXPECT_NEAR(got[t], fp[t], 1e-9) << p.sink << "/" << p.recent;
  }
  // One position fewer protected and the last query reads one coded entry.
  const auto edge = window_token_nll(m, ids, 1, &coder, CachePolicy{20, 18});
  // (Earlier queries come from a forward one token shorter: equal up to GEMM rounding.)
  for (size_t t = 0; t + 1 < fp.size(); ++t) EXPECT_NEAR(edge[t], fp[t], 1e-5);
  EXPECT_GT(std::fabs(edge.back() - fp.back()), 1e-6);
}

TEST(Perplexity, BitsOrderPerplexity) {
  const Model& m = demo();
  const auto ids = psalm_ids(257);
  const double fp = mean(window_token_nll(m, ids, 1, nullptr));
  double prev = 1e9;
  for (int b : {1, 2, 4, 8}) {
    KvCoder coder(m.config(), uniform(m.config(), b, b), "test");
    const double nll = mean(window_token_nll(m, ids, 1, &coder));
    std::printf("uniform %d bits: PPL %.4f (fp32 %.4f)\n", b, std::exp(nll), std::exp(fp));
    EXPECT_LT(nll, prev) << b;
    prev = nll;
  }
  EXPECT_LT(std::exp(prev) / std::exp(fp), 1.005) << "8 bits within 0.5% of fp32";
}

TEST(Perplexity, SlidingWindowsScoreEveryTokenOnce) {
  const Model& m = demo();
  auto ids = psalm_ids(200);
  std::vector<int32_t> text(ids.begin() + 1, ids.end());  // 199 text tokens
  PplOptions o;
  o.prefix = {1};
  o.quiet = true;
  // One window holding everything: the single-window NLL of generate.hpp.
  o.window = 200;
  o.stride = 100;
  PplResult one = sliding_perplexity(m, text, o, nullptr);
  EXPECT_EQ(one.windows, 1);
  EXPECT_EQ(one.tokens, 199);
  EXPECT_NEAR(one.nll(), window_nll(m, ids), 1e-6);
  // Disjoint windows (stride = window - 1): the sum of independent windows.
  o.window = 64;
  o.stride = 63;
  PplResult dis = sliding_perplexity(m, text, o, nullptr);
  double sum = 0;
  for (size_t b = 0; b < text.size(); b += 63) {
    std::vector<int64_t> w{1};
    for (size_t t = b; t < std::min(text.size(), b + 63); ++t) w.push_back(text[t]);
    sum += window_nll(m, w) * double(w.size() - 1);
  }
  EXPECT_EQ(dis.tokens, 199);
  EXPECT_NEAR(dis.nll_sum, sum, 1e-6 * sum);
  // Overlapping windows: still every token once, and more context than disjoint windows helps.
  KvCoder coder(m.config(), uniform(m.config(), 3, 3), "test");
  for (int s : {1, 7, 32}) {
    o.stride = s;
    for (CachePolicy p : {CachePolicy{0, 0}, CachePolicy{2, 40}}) {
      o.policy = p;
      PplResult r = sliding_perplexity(m, text, o, &coder);
      EXPECT_EQ(r.tokens, 199) << s;
    }
    o.policy = {};
    EXPECT_LT(sliding_perplexity(m, text, o, nullptr).nll(), dis.nll()) << s;
  }
}

// The end-to-end KL kvq-eval reports (PplOptions::kl) against the whole forward window by window:
// each window's unquantized and coded logits (every layer's K/V coded from position 0, the plain
// cache), KL(p || q) in plain double loops over the rows it scores (the tokens past the previous
// window), summed and divided by the tokens scored.
class CodeEverything : public KvTransform {
 public:
  explicit CodeEverything(const KvCoder& c) : c_(c) {}
  void apply(LayerKv& kv) override {
    const int rk = kv.n_kv_heads * kv.head_dim, rv = kv.n_kv_heads * kv.v_dim();
    for (int b = 0; b < kv.batch; ++b) c_.code(kv.layer, kv.k + b * kv.seq * rk, kv.v + b * kv.seq * rv, kv.seq, kv.positions);
  }

 private:
  const KvCoder& c_;
};

TEST(Perplexity, EndToEndKlEqualsTheWholeForwardWindowByWindow) {
  c10::InferenceMode guard;
  const Model& m = demo();
  auto ids = psalm_ids(150);
  std::vector<int32_t> text(ids.begin() + 1, ids.end());
  KvCoder coder(m.config(), uniform(m.config(), 2, 2), "test");
  PplOptions o;
  o.prefix = {1};
  o.quiet = true;
  o.window = 48;
  o.stride = 20;
  o.kl = true;
  const PplResult r = sliding_perplexity(m, text, o, &coder);
  ASSERT_TRUE(r.has_kl);
  double kl = 0;
  int64_t scored = 0;
  const int64_t n = int64_t(text.size());
  for (int64_t begin = 0, prev_end = 0;; begin += o.stride) {
    const int64_t end = std::min<int64_t>(begin + o.window - 1, n);
    std::vector<int64_t> w{1};
    for (int64_t t = begin; t < end; ++t) w.push_back(text[size_t(t)]);
    const int first = std::max<int>(1, int(w.size()) - int(end - prev_end));
    const at::Tensor x = at::tensor(std::vector<int64_t>(w.begin(), w.end() - 1), at::kLong);
    const at::Tensor a = m.forward(x)[0].to(at::kDouble).contiguous();
    CodeEverything hook(coder);
    Model::ForwardOptions fo;
    fo.kv_transform = &hook;
    const at::Tensor b = m.forward(x, fo)[0].to(at::kDouble).contiguous();
    const int64_t V = a.size(1);
    for (int64_t row = first - 1; row < int64_t(w.size()) - 1; ++row) {
      const double* pa = a[row].data_ptr<double>();
      const double* pb = b[row].data_ptr<double>();
      double ma = pa[0], mb = pb[0], za = 0, zb = 0;
      for (int64_t v = 1; v < V; ++v) ma = std::max(ma, pa[v]), mb = std::max(mb, pb[v]);
      for (int64_t v = 0; v < V; ++v) za += std::exp(pa[v] - ma), zb += std::exp(pb[v] - mb);
      for (int64_t v = 0; v < V; ++v) {
        const double la = pa[v] - ma - std::log(za), lb = pb[v] - mb - std::log(zb);
        kl += std::exp(la) * (la - lb);
      }
      ++scored;
    }
    prev_end = end;
    if (end == n) break;
  }
  EXPECT_EQ(scored, r.tokens);
  EXPECT_GT(kl, 0.0);
  EXPECT_NEAR(r.kl(), kl / double(scored), 1e-6 * kl / double(scored));
  std::printf("end-to-end KL (uniform 2 bits, demo, 149 tokens): %.6g (whole forward per window %.6g)\n", r.kl(),
              kl / double(scored));
  // Nothing coded (every entry protected) is KL 0; without kl it is not computed.
  o.policy = {48, 0};
  EXPECT_EQ(sliding_perplexity(m, text, o, &coder).kl(), 0.0);
  o.policy = {};
  o.kl = false;
  EXPECT_FALSE(sliding_perplexity(m, text, o, &coder).has_kl);
}

// A tokenizer without BOS (Qwen): windows are text only, and the text's first token, which has no
// context, is the one token not scored.
TEST(Perplexity, WithoutBosEveryTokenButTheFirstIsScoredOnce) {
  const Model& m = demo();
  auto ids = psalm_ids(130);
  std::vector<int32_t> text(ids.begin() + 1, ids.end());  // 129 text tokens
  PplOptions o;
  o.prefix = {};
  o.quiet = true;
  o.window = 129;
  o.stride = 64;
  const std::vector<int64_t> all(text.begin(), text.end());
  PplResult one = sliding_perplexity(m, text, o, nullptr);
  EXPECT_EQ(one.tokens, 128);
  EXPECT_NEAR(one.nll(), window_nll(m, all), 1e-6);
  // Stride window - 1: window k starts one token before the first token it scores (text[42k]
  // is context for text[42k+1 ..]), so it is the independent window over text[42k, 42k + 43).
  o.window = 43;
  o.stride = 42;
  PplResult dis = sliding_perplexity(m, text, o, nullptr);
  double sum = 0;
  for (size_t b = 0; b + 1 < text.size(); b += 42) {
    const std::vector<int64_t> w(text.begin() + long(b), text.begin() + long(std::min(text.size(), b + 43)));
    sum += window_nll(m, w) * double(w.size() - 1);
  }
  EXPECT_EQ(dis.tokens, 128);
  EXPECT_NEAR(dis.nll_sum, sum, 1e-6 * sum);
}

// A two-token prefix (GLM-4's [gMASK] <sop>; here ids 1 and 5 of the demo model): windows are the
// prefix + window - 2 text tokens, every text token is scored once, the prefix's second token never.
// Truth: independent windows (stride window - 2) from generate.hpp's single-window mean NLL, less
// the prefix's own term.
TEST(Perplexity, TwoTokenPrefixScoresEveryTextTokenOnce) {
  const Model& m = demo();
  auto ids = psalm_ids(101);
  std::vector<int32_t> text(ids.begin() + 1, ids.end());  // 100 text tokens
  PplOptions o;
  o.prefix = {1, 5};
  o.quiet = true;
  o.window = 34;
  o.stride = 32;
  const PplResult dis = sliding_perplexity(m, text, o, nullptr);
  const double prefix_term = window_nll(m, {1, 5});  // NLL of 5 after 1: in every window, never scored
  double sum = 0;
  int64_t windows = 0;
  for (size_t b = 0; b < text.size(); b += 32) {
    std::vector<int64_t> w{1, 5};
    for (size_t t = b; t < std::min(text.size(), b + 32); ++t) w.push_back(text[t]);
    sum += window_nll(m, w) * double(w.size() - 1) - prefix_term;
    ++windows;
  }
  EXPECT_EQ(dis.tokens, 100);
  EXPECT_EQ(dis.windows, windows);
  EXPECT_NEAR(dis.nll_sum, sum, 1e-6 * sum);
  // One window holding everything.
  o.window = 102;
  o.stride = 50;
  const PplResult one = sliding_perplexity(m, text, o, nullptr);
  std::vector<int64_t> all{1, 5};
  all.insert(all.end(), text.begin(), text.end());
  EXPECT_EQ(one.windows, 1);
  EXPECT_NEAR(one.nll_sum, window_nll(m, all) * 101.0 - prefix_term, 1e-6 * one.nll_sum);
  // Stride window - 1 would skip a text token per window; a window no longer than the prefix holds none.
  auto msg = [&](PplOptions x) {
    try {
      sliding_perplexity(m, text, x, nullptr);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  o.window = 34, o.stride = 33;
  EXPECT_NE(msg(o).find("--stride"), std::string::npos) << msg(o);
  EXPECT_NE(msg(o).find("window - 2 = 32"), std::string::npos) << msg(o);
  o.window = 2, o.stride = 1;
  EXPECT_NE(msg(o).find("--window"), std::string::npos) << msg(o);
}

TEST(Perplexity, BadWindowsAreUserErrors) {
  const Model& m = demo();
  std::vector<int32_t> text(50, 5);
  PplOptions o;
  o.quiet = true;
  auto msg = [&](PplOptions x) {
    try {
      sliding_perplexity(m, text, x, nullptr);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  o.window = 1, o.stride = 1;
  EXPECT_NE(msg(o).find("--window"), std::string::npos);
  o.window = 100000;
  EXPECT_NE(msg(o).find("--window"), std::string::npos);
  o.window = 32, o.stride = 32;
  EXPECT_NE(msg(o).find("--stride"), std::string::npos);
  o.stride = 8, o.policy.sink = -1;
  EXPECT_NE(msg(o).find("--sink"), std::string::npos);
  o.policy = {};
  text.clear();
  EXPECT_NE(msg(o).find("no tokens"), std::string::npos);
}

// Post-RoPE decisions (Block-GTQ K) are coded where they were allocated: rotated to the token's
// position, coded, rotated back. Checked against the codec's own RoPE (double-precision angles).
TEST(KvCoder, PostRopeDecisionsAreCodedAfterRope) {
  const ModelConfig& c = demo().config();
  const int d = c.head_dim, H = c.n_kv_heads, n = 9;
  auto heads = uniform(c, 3, 3, true);
  KvCoder coder(c, heads, "test");
  std::mt19937 rng(7);
  std::normal_distribution<float> g;
  std::vector<float> k(size_t(n) * H * d), v(k.size());
  for (auto& x : k) x = g(rng);
  for (auto& x : v) x = g(rng);
  std::vector<int64_t> pos(n);
  for (int t = 0; t < n; ++t) pos[t] = 100 + 37 * t;
  auto k2 = k, v2 = v;
  coder.code(1, k2.data(), v2.data(), n, pos.data());
  codec::RopeSpec rope;
  rope.enabled = true;
  rope.theta = c.rope_theta;
  rope.rotary_dim = c.rotary_dim;
  rope.pairing = c.pairing;
  double max_k = 0, max_v = 0;
  for (int h = 0; h < H; ++h) {
    const HeadDecision *kd = nullptr, *vd = nullptr;
    for (const auto& x : heads)
      if (x.layer == 1 && x.kv_head == h) (x.side == Side::kK ? kd : vd) = &x;
    codec::HeadCodec kc(*kd, d), vc(*vd, d);
    for (int t = 0; t < n; ++t) {
      std::vector<float> x(k.begin() + long((size_t(t) * H + h) * d), k.begin() + long((size_t(t) * H + h + 1) * d));
      codec::reference_apply_rope(x.data(), d, pos[t], rope);
      std::vector<float> y(static_cast<size_t>(d));
      kc.round_trip(x.data(), 1, y.data());
      codec::RopeSpec inv = rope;
      // Inverse RoPE = RoPE at the negated position.
      codec::reference_apply_rope(y.data(), d, -pos[t], inv);
      std::vector<float> vx(v.begin() + long((size_t(t) * H + h) * d), v.begin() + long((size_t(t) * H + h + 1) * d));
      std::vector<float> vy(static_cast<size_t>(d));
      vc.round_trip(vx.data(), 1, vy.data());
      for (int i = 0; i < d; ++i) {
        max_k = std::max(max_k, double(std::fabs(y[size_t(i)] - k2[(size_t(t) * H + h) * d + size_t(i)])));
        max_v = std::max(max_v, double(std::fabs(vy[size_t(i)] - v2[(size_t(t) * H + h) * d + size_t(i)])));
      }
    }
  }
  EXPECT_LT(max_k, 1e-4);
  EXPECT_EQ(max_v, 0.0);
  // ... and differently from the same decision coded pre-RoPE.
  auto pre = heads;
  for (auto& x : pre) x.post_rope = false;
  auto k3 = k, v3 = v;
  KvCoder(c, pre, "test").code(1, k3.data(), v3.data(), n, pos.data());
  double diff = 0;
  for (size_t i = 0; i < k3.size(); ++i) diff = std::max(diff, double(std::fabs(k3[i] - k2[i])));
  EXPECT_GT(diff, 1e-3);
}

TEST(KvCoder, RefusesIncompleteOrForeignDecisions) {
  const ModelConfig& c = demo().config();
  auto msg = [&](std::vector<HeadDecision> h) {
    try {
      KvCoder(c, h, "a.kvqalloc.h5");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  auto h = uniform(c, 2, 2);
  EXPECT_EQ(msg(h), "");
  auto missing = h;
  missing.pop_back();
  EXPECT_NE(msg(missing).find("no decision for V layer 3 head 1"), std::string::npos) << msg(missing);
  auto dup = h;
  dup.push_back(h[0]);
  EXPECT_NE(msg(dup).find("two decisions"), std::string::npos);
  auto out = h;
  out[0].layer = 9;
  EXPECT_NE(msg(out).find("outside the model"), std::string::npos);
  auto kivi = h;
  kivi[0].kind = CodingKind::kKivi;
  kivi[0].bits = 2;
  EXPECT_NE(msg(kivi).find("KIVI"), std::string::npos);
  auto wrong_d = h;
  wrong_d[3].groups[0].dims.pop_back();
  EXPECT_NE(msg(wrong_d), "");
}
