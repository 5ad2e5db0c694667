// The protected cache (--sink/--recent) in one forward per window, against the multi-forward method
// of multi_forward_reference.hpp (plain forwards whose K/V a KvTransform rewrites: a second
// implementation that shares no code with the forward's protected path), on the demo model,
// stories260K, and a tiny Qwen2 with sliding-window and full layers; and the cost: one forward per
// window.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "hf_tiny.hpp"
#include "kvq/alloc/uniform.hpp"
#include "kvq/eval/kv_coder.hpp"
#include "kvq/eval/perplexity.hpp"
#include "kvq/tokenizer/tokenizer.hpp"
#include "kvq/util/atomic_file.hpp"
#include "multi_forward_reference.hpp"
#include "shared_data.hpp"

using namespace kvq;

namespace {

const std::string kDemo = std::string(KVQ_SOURCE_DIR) + "/data/kvq-demo-llama";
const char* kStories = "models/stories260K/stories260K.bin";
const char* kStoriesTok = "models/stories260K/tok512.bin";

// [BOS] + the first n-1 tokens of psalm23.txt (repeated when it is shorter) under `tok`.
std::vector<int64_t> psalm_ids(const Tokenizer& tok, int n) {
  const auto text = tok.encode(read_file(kDemo + "/psalm23.txt"));
  std::vector<int64_t> ids{tok.bos_id()};
  while (int(ids.size()) < n) ids.push_back(text[(ids.size() - 1) % text.size()]);
  return ids;
}

std::vector<HeadDecision> uniform(const ModelConfig& c, int k_bits, int v_bits) {
  alloc::Shape s{c.n_layers, c.n_kv_heads, c.head_dim};
  auto k = alloc::allocate_uniform(s, Side::kK, k_bits, {}).heads;
  auto v = alloc::allocate_uniform(s, Side::kV, v_bits, {}).heads;
  k.insert(k.end(), v.begin(), v.end());
  return k;
}

double mean(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0) / double(v.size()); }

// The policies every model is checked at, for a window of T tokens (queries 0..T-2). The last two
// are the edges of "any query reads a coded entry": sink + recent = T - 2 leaves exactly one coded
// pair (the last query, key `sink`); recent >= T protects everything.
std::vector<CachePolicy> policies(int T) {
  return {CachePolicy{0, 0}, CachePolicy{4, 0},  CachePolicy{0, 16},     CachePolicy{4, 16},
          CachePolicy{1, 70}, CachePolicy{3, T - 5}, CachePolicy{4, T + 8}};
}

// The two methods run forwards of different shapes, so their K/V differ by fp32 rounding (GEMM
// blocking, the order of the attention sums: the one-forward path adds P_full·V and P_coded·V_coded
// as two products); a value that close to a quantizer boundary could code to the neighbouring
// level in one of them. At 3 bits on these models the NLLs agree to 2e-5 per token (see the printed
// figures), so: per token |difference| below 2e-4 and mean below 2e-5, where protecting one more
// recent entry (the control below) moves some token by more than 2e-4.
constexpr double kTokTol = 2e-4, kMeanTol = 2e-5;

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t t = 0; t < a.size(); ++t) m = std::max(m, std::fabs(a[t] - b[t]));
  return m;
}

void expect_matches_multi_forward(const Model& m, const std::vector<int64_t>& ids, const KvCoder& coder,
                                  const std::string& name) {
  const int T = int(ids.size());
  for (const CachePolicy& p : policies(T)) {
    const auto ref = test::multi_forward_nll(m, ids, coder, p);
    const auto got = window_token_nll(m, ids, 1, &coder, p);
    ASSERT_EQ(got.size(), ref.size());
    double sum_diff = 0;
    for (size_t t = 0; t < ref.size(); ++t) sum_diff += std::fabs(got[t] - ref[t]);
    const double max_diff = max_abs_diff(got, ref), mean_diff = sum_diff / double(ref.size());
    EXPECT_LT(max_diff, kTokTol) << name << " sink " << p.sink << " recent " << p.recent;
    EXPECT_LT(mean_diff, kMeanTol) << name << " sink " << p.sink << " recent " << p.recent;
    std::printf("%s T=%d sink %2d recent %3d: mean NLL %.6f (multi-forward %.6f), |diff| max %.2e mean %.2e\n",
                name.c_str(), T, p.sink, p.recent, mean(got), mean(ref), max_diff, mean_diff);
  }
  // Control: one more recent entry protected is visible at this tolerance.
  for (const CachePolicy& p : {CachePolicy{4, 16}, CachePolicy{0, 16}}) {
    const CachePolicy moved{p.sink, p.recent + 1};
    const double d =
        max_abs_diff(window_token_nll(m, ids, 1, &coder, p), test::multi_forward_nll(m, ids, coder, moved));
    std::printf("%s control: recent %d vs %d moves a token by %.2e\n", name.c_str(), p.recent, moved.recent, d);
    EXPECT_GT(d, kTokTol) << name << ": the test cannot tell recent " << p.recent << " from " << moved.recent;
  }
}

}  // namespace

TEST(ProtectedCache, OneForwardMatchesMultiForwardDemo) {
  const Model m = Model::load(kDemo);
  const auto tok = Tokenizer::load(kDemo + "/tokenizer.model");
  KvCoder coder(m.config(), uniform(m.config(), 3, 3), "test");
  // 96 tokens: two query blocks of the attention, the coded band crossing between them.
  expect_matches_multi_forward(m, psalm_ids(*tok, 96), coder, "demo");
}

TEST(ProtectedCache, OneForwardMatchesMultiForwardStories260K) {
  KVQ_REQUIRE_SHARED(kStories);
  const Model m = Model::load(test::shared_path(kStories));
  const auto tok = Tokenizer::load(test::shared_path(kStoriesTok));
  KvCoder coder(m.config(), uniform(m.config(), 3, 3), "test");
  expect_matches_multi_forward(m, psalm_ids(*tok, 96), coder, "stories260K");
}

// Qwen2 with max_window_layers 1: layer 0 full causal, layers 1-2 slide (W = 20 < T, so query
// blocks start their keys inside the window and the sink falls out of late queries' windows);
// 6 query heads on 2 KV heads (GQA groups of 3).
TEST(ProtectedCache, OneForwardMatchesMultiForwardSlidingWindowGqa) {
  namespace hf = test::hf;
  hf::Spec s;
  s.family = "qwen2";
  s.hidden = 48;
  s.heads = 6;
  s.kv_heads = 2;
  s.head_dim = 16;
  s.layers = 3;
  s.use_sliding_window = true;
  s.sliding_window = 20;
  s.max_window_layers = 1;
  s.vocab = 64;
  const std::string dir = ::testing::TempDir() + "/kvq_protected_qwen2";
  hf::write_model(dir, hf::make_config(s), hf::make_weights(s), 2);
  const Model m = Model::load(dir);
  ASSERT_EQ(m.config().layer_window, (std::vector<int>{0, 20, 20}));
  std::mt19937 rng(5);
  std::vector<int64_t> ids{1};
  while (ids.size() < 90) ids.push_back(int64_t(3 + rng() % 61));
  KvCoder coder(m.config(), uniform(m.config(), 3, 3), "test");
  expect_matches_multi_forward(m, ids, coder, "qwen2-sliding");
}

// Goal: one forward per window, whatever the policy. With one window per forward (max_batch_tokens
// = window) the forward count is the window count and every window's tokens pass once; batched,
// the windows share forwards and the sum of NLLs is the same (the attention's chunks of windows
// included: at T = 256 a chunk holds 16 of the demo model's windows, and there are 20 windows).
TEST(ProtectedCache, OneForwardPerWindow) {
  const Model m = Model::load(kDemo);
  const auto tok = Tokenizer::load(kDemo + "/tokenizer.model");
  KvCoder coder(m.config(), uniform(m.config(), 3, 3), "test");
  const auto ids = psalm_ids(*tok, 560);
  const std::vector<int32_t> text(ids.begin() + 1, ids.end());
  PplOptions o;
  o.window = 256;
  o.stride = 16;
  o.quiet = true;
  for (const CachePolicy& p : {CachePolicy{4, 128}, CachePolicy{0, 16}}) {
    o.policy = p;
    o.max_batch_tokens = o.window;
    const PplResult one = sliding_perplexity(m, text, o, &coder);
    // The windows and their lengths, counted here: window k holds BOS + text[16k, 16k + 255).
    int64_t windows = 0, tokens = 0;
    for (int64_t begin = 0;; begin += o.stride) {
      const int64_t end = std::min<int64_t>(begin + o.window - 1, int64_t(text.size()));
      ++windows;
      tokens += end - begin;  // BOS + (end - begin) tokens: the forward sees all but the last
      if (end == int64_t(text.size())) break;
    }
    EXPECT_EQ(one.windows, windows);
    EXPECT_EQ(one.forwards, windows) << "sink " << p.sink << " recent " << p.recent;
    EXPECT_EQ(one.forward_tokens, tokens) << "sink " << p.sink << " recent " << p.recent;
    std::printf("sink %d recent %3d: %lld windows, %lld forwards, %.3f forward tokens per window token\n", p.sink,
                p.recent, (long long)one.windows, (long long)one.forwards,
                double(one.forward_tokens) / double(tokens));
    o.max_batch_tokens = 16384;
    const PplResult batched = sliding_perplexity(m, text, o, &coder);
    EXPECT_LT(batched.forwards, windows);
    EXPECT_EQ(batched.forward_tokens, tokens);
    EXPECT_EQ(batched.tokens, one.tokens);
    EXPECT_NEAR(batched.nll_sum, one.nll_sum, 1e-4 * double(one.tokens));
  }
}
