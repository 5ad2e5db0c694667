// RoPE scaling (config.json rope_scaling / rope_parameters): the inverse frequencies and attention
// factor of every supported type against values computed here in long double straight from the
// published formulas (transformers' modeling_rope_utils, as ../shared/MODEL-FAMILIES.md states
// them), the config parser's refusals, and the forward using the scaled frequencies.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "kvq/model/config.hpp"
#include "kvq/model/model.hpp"
#include "hf_reference.hpp"
#include "hf_tiny.hpp"
#include "model_test_util.hpp"

namespace kvq {
namespace {

using ld = long double;
const ld kPi = 3.141592653589793238462643383279502884L;

ld base_freq(ld theta, int d, int j) { return std::pow(theta, -ld(2 * j) / ld(d)); }

void expect_rel(const std::vector<double>& got, const std::vector<ld>& want, double tol = 1e-12) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t j = 0; j < want.size(); ++j)
    EXPECT_NEAR(double(got[j] / want[j]), 1.0, tol) << "block " << j << ": " << got[j] << " vs " << double(want[j]);
}

ModelConfig cfg_of(double theta, int d, int max_pos) {
  ModelConfig c;
  c.rope_theta = theta;
  c.head_dim = c.rotary_dim = d;
  c.max_seq_len = max_pos;
  return c;
}

TEST(RopeScaling, DefaultIsThetaPower) {
  const ModelConfig c = cfg_of(500000.0, 128, 8192);
  std::vector<ld> want;
  for (int j = 0; j < 64; ++j) want.push_back(base_freq(500000.0L, 128, j));
  const RopeParams p = rope_params(c, 512);
  expect_rel(p.inv_freq, want);
  EXPECT_EQ(p.attention_factor, 1.0);
}

TEST(RopeScaling, LinearDividesByFactor) {
  ModelConfig c = cfg_of(10000.0, 64, 2048);
  c.rope_scaling.type = RopeType::kLinear;
  c.rope_scaling.factor = 4.0;
  std::vector<ld> want;
  for (int j = 0; j < 32; ++j) want.push_back(base_freq(10000.0L, 64, j) / 4.0L);
  expect_rel(rope_params(c, 100).inv_freq, want);
}

// Llama-3.1's published setting: theta 5e5, d 128, factor 8, low 1, high 4, original 8192.
TEST(RopeScaling, Llama3BandsOfLlama31) {
  ModelConfig c = cfg_of(500000.0, 128, 131072);
  c.rope_scaling.type = RopeType::kLlama3;
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 8192;
  std::vector<ld> want;
  int kept = 0, divided = 0, blended = 0;
  for (int j = 0; j < 64; ++j) {
    const ld f = base_freq(500000.0L, 128, j);
    // Periods in tokens: shorter than 8192/4 = 2048 keep their frequency, longer than 8192/1 are
    // slowed 8x, and in between the frequency moves linearly in (8192 / period) from one to the other.
    const ld period = 2 * kPi / f;
    if (period < 2048) {
      want.push_back(f);
      ++kept;
    } else if (period > 8192) {
      want.push_back(f / 8);
      ++divided;
    } else {
      const ld t = (8192 / period - 1) / (4 - 1);  // 0 at the slow edge, 1 at the fast edge
      want.push_back(f / 8 + t * (f - f / 8));
      ++blended;
    }
  }
  expect_rel(rope_params(c, 0).inv_freq, want);
  // The bands Llama-3.1 has (a property of its constants, not of this code).
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
  EXPECT_EQ(rope_params(c, 0).attention_factor, 1.0);
  // llama3 scaling applies at every length.
  EXPECT_EQ(rope_params(c, 10).inv_freq, rope_params(c, 100000).inv_freq);
}

TEST(RopeScaling, DynamicNtkGrowsTheBaseOnlyPastTheTrainedLength) {
  ModelConfig c = cfg_of(10000.0, 64, 2048);
  c.rope_scaling.type = RopeType::kDynamic;
  c.rope_scaling.factor = 2.0;
  std::vector<ld> plain;
  for (int j = 0; j < 32; ++j) plain.push_back(base_freq(10000.0L, 64, j));
  expect_rel(rope_params(c, 1000).inv_freq, plain);
  expect_rel(rope_params(c, 2048).inv_freq, plain);
  const ld L = 6000, M = 2048, f = 2;
  const ld base = 10000.0L * std::pow(f * L / M - (f - 1), ld(64) / ld(62));
  std::vector<ld> grown;
  for (int j = 0; j < 32; ++j) grown.push_back(base_freq(base, 64, j));
  expect_rel(rope_params(c, 6000).inv_freq, grown);
  EXPECT_EQ(rope_params(c, 6000).attention_factor, 1.0);
}

std::vector<ld> yarn_want(ld theta, int d, ld f, ld orig, ld beta_fast, ld beta_slow, bool truncate) {
  // The block whose frequency turns `r` times over the original length, solved from
  // orig * theta^(-2j/d) / (2 pi) = r.
  auto block_at = [&](ld r) { return (ld(d) / 2) * std::log(orig / (2 * kPi * r)) / std::log(theta); };
  ld lo = block_at(beta_fast), hi = block_at(beta_slow);
  if (truncate) {
    lo = std::floor(lo);
    hi = std::ceil(hi);
  }
  if (lo < 0) lo = 0;
  if (hi > d - 1) hi = d - 1;
  if (lo == hi) hi += 0.001L;
  std::vector<ld> want;
  for (int j = 0; j < d / 2; ++j) {
    ld r = (j - lo) / (hi - lo);
    r = r < 0 ? 0 : (r > 1 ? 1 : r);
    const ld fj = base_freq(theta, d, j);
    want.push_back((1 - r) * fj + r * fj / f);  // fast blocks extrapolate, slow ones interpolate
  }
  return want;
}

TEST(RopeScaling, YarnRampAndAttentionFactor) {
  // Qwen's documented long-context setting: factor 4 over 32768 trained positions, theta 1e6.
  ModelConfig c = cfg_of(1000000.0, 128, 131072);
  c.rope_scaling.type = RopeType::kYarn;
  c.rope_scaling.factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 32768;
  const RopeParams p = rope_params(c, 0);
  expect_rel(p.inv_freq, yarn_want(1e6L, 128, 4, 32768, 32, 1, true));
  EXPECT_NEAR(p.attention_factor, 0.1 * std::log(4.0) + 1.0, 1e-15);  // 1.1386...

  c.rope_scaling.truncate = false;
  expect_rel(rope_params(c, 0).inv_freq, yarn_want(1e6L, 128, 4, 32768, 32, 1, false));

  // DeepSeek-style mscale / mscale_all_dim ratio, and an explicit attention_factor.
  c.rope_scaling.mscale = 0.707;
  c.rope_scaling.mscale_all_dim = 0.707;
  EXPECT_NEAR(rope_params(c, 0).attention_factor, 1.0, 1e-15);
  c.rope_scaling.mscale = 1.0;
  EXPECT_NEAR(rope_params(c, 0).attention_factor,
              (0.1 * std::log(4.0) + 1.0) / (0.1 * 0.707 * std::log(4.0) + 1.0), 1e-15);
  c.rope_scaling.attention_factor = 0.5;
  EXPECT_EQ(rope_params(c, 0).attention_factor, 0.5);
  // original_max_position_embeddings defaults to max_position_embeddings.
  c.rope_scaling = RopeScaling{};
  c.rope_scaling.type = RopeType::kYarn;
  c.rope_scaling.factor = 2.0;
  expect_rel(rope_params(c, 0).inv_freq, yarn_want(1e6L, 128, 2, 131072, 32, 1, true));
}

// ---- config.json parsing ---------------------------------------------------------------------

using test::TempDir;
using test::expect_error;
namespace hf = test::hf;
namespace ref = test::ref;

std::string write_model(const TempDir& dir, const nlohmann::json& extra) {
  test::TinySpec s;
  nlohmann::json c = test::tiny_config(s);
  for (auto it = extra.begin(); it != extra.end(); ++it) c[it.key()] = it.value();
  const std::string path = dir / "m";
  test::write_hf_dir(path, c, test::tiny_weights(s));
  return path;
}

TEST(RopeScalingConfig, ReadsEveryTypeAndBothKeys) {
  TempDir dir;
  {
    const Model m = Model::load(write_model(dir, {{"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0},
                                                                    {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                                                                    {"original_max_position_embeddings", 64}}}}));
    EXPECT_EQ(m.config().rope_scaling.type, RopeType::kLlama3);
    EXPECT_EQ(m.config().rope_scaling.original_max_position_embeddings, 64);
  }
  std::filesystem::remove_all(dir / "m");
  {
    const Model m = Model::load(write_model(dir, {{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}}));
    EXPECT_EQ(m.config().rope_scaling.type, RopeType::kLinear);
    EXPECT_EQ(m.config().rope_scaling.factor, 2.0);
  }
  std::filesystem::remove_all(dir / "m");
  {  // transformers 5: rope_parameters carries rope_theta
    nlohmann::json extra = {{"rope_parameters", {{"rope_type", "yarn"}, {"factor", 4.0}, {"rope_theta", 123456.0},
                                                 {"original_max_position_embeddings", 32}}}};
    const Model m = Model::load(write_model(dir, extra));
    EXPECT_EQ(m.config().rope_scaling.type, RopeType::kYarn);
    EXPECT_EQ(m.config().rope_theta, 123456.0);
  }
  std::filesystem::remove_all(dir / "m");
  {
    const Model m = Model::load(write_model(dir, {{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 5e5}}}}));
    EXPECT_EQ(m.config().rope_scaling.type, RopeType::kDefault);
    EXPECT_EQ(m.config().rope_theta, 5e5);
  }
}

TEST(RopeScalingConfig, BadValuesAreOneLineErrors) {
  struct Case {
    nlohmann::json extra;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {{{"rope_scaling", {{"rope_type", "linear"}}}}, {"rope_scaling.factor", "missing"}},
      {{{"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}}}},
       {"rope_scaling.original_max_position_embeddings", "missing"}},
      {{{"rope_scaling", {{"rope_type", "longrope"}, {"factor", 8.0}}}}, {"rope_scaling.rope_type", "longrope", "not supported"}},
      {{{"rope_scaling", {{"type", "mystery"}, {"factor", 2.0}}}}, {"rope_scaling.type", "mystery"}},
      {{{"rope_scaling", {{"factor", 2.0}}}}, {"rope_scaling.rope_type", "missing"}},
      {{{"rope_scaling", {{"rope_type", "linear"}, {"factor", -1.0}}}}, {"rope_scaling.factor", "-1"}},
      {{{"rope_scaling", {{"rope_type", "linear"}, {"factor", "2"}}}}, {"rope_scaling.factor", "\"2\""}},
      {{{"rope_scaling", "yarn"}}, {"rope_scaling", "expected an object"}},
      {{{"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0}, {"high_freq_factor", 1.0},
                          {"original_max_position_embeddings", 64}}}},
       {"rope_scaling.high_freq_factor"}},
  };
  for (const auto& cs : cases) {
    TempDir dir;
    const std::string path = write_model(dir, cs.extra);
    SCOPED_TRACE(cs.extra.dump());
    expect_error([&] { Model::load(path); }, cs.parts);
  }
}

// ---- the forward uses the scaled RoPE ---------------------------------------------------------

// Capture observer that keeps layer 0's pre-RoPE q and k.
struct Keep : CaptureObserver {
  std::vector<float> q, k;
  int H = 0, Hk = 0, d = 0, T = 0;
  void on_layer(const LayerCapture& c) override {
    if (c.layer != 0) return;
    H = c.n_heads, Hk = c.n_kv_heads, d = c.head_dim, T = c.seq;
    q.assign(c.q, c.q + size_t(c.seq) * H * d);
    k.assign(c.k, c.k + size_t(c.seq) * Hk * d);
  }
};

// apply_rope (the forward's kernel) against a double rotation with the independently computed
// frequencies and attention factor, for yarn (af != 1) at long positions.
TEST(RopeScalingForward, ApplyRopeUsesScaledFrequenciesAndFactor) {
  ModelConfig c = cfg_of(10000.0, 16, 64);
  c.pairing = RopePairing::kSplitHalf;
  c.rope_scaling.type = RopeType::kYarn;
  c.rope_scaling.factor = 8.0;
  const auto want = yarn_want(10000.0L, 16, 8, 64, 32, 1, true);
  const double af = 0.1 * std::log(8.0) + 1.0;
  const int T = 5, H = 2, d = 16;
  std::vector<int64_t> pos = {0, 1, 63, 200, 511};
  std::vector<float> x(size_t(T) * H * d);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(0.37 * double(i) + 0.1));
  std::vector<float> y = x;
  apply_rope(y.data(), H, T, d, pos.data(), c);
  double worst = 0;
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h)
      for (int j = 0; j < d / 2; ++j) {
        const float* in = x.data() + (size_t(t) * H + h) * d;
        const float* out = y.data() + (size_t(t) * H + h) * d;
        const double ang = double(pos[size_t(t)]) * double(want[size_t(j)]);
        const double ea = af * (in[j] * std::cos(ang) - in[j + d / 2] * std::sin(ang));
        const double eb = af * (in[j + d / 2] * std::cos(ang) + in[j] * std::sin(ang));
        worst = std::max({worst, std::abs(out[j] - ea), std::abs(out[j + d / 2] - eb)});
      }
  EXPECT_LT(worst, 1e-5);
  // The inverse undoes rotation and factor.
  apply_rope(y.data(), H, T, d, pos.data(), c, /*inverse=*/true);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-5);
}

// Two models that differ only in rope_scaling give different logits past the high-frequency band
// but the same pre-RoPE capture (scaling only acts on q/k after the projection).
TEST(RopeScalingForward, ScalingChangesLogitsNotThePreRopeCapture) {
  TempDir dir;
  test::TinySpec s;
  s.head_dim = 16, s.heads = 2, s.kv_heads = 1, s.hidden = 32;
  nlohmann::json c = test::tiny_config(s);
  test::write_hf_dir(dir / "plain", c, test::tiny_weights(s));
  c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 16}};
  test::write_hf_dir(dir / "scaled", c, test::tiny_weights(s));
  const Model a = Model::load(dir / "plain"), b = Model::load(dir / "scaled");
  std::vector<int64_t> ids;
  for (int t = 0; t < 24; ++t) ids.push_back((t * 7 + 3) % s.vocab);
  const at::Tensor x = at::tensor(ids, at::kLong);
  Keep ka, kb;
  Model::ForwardOptions oa, ob;
  oa.observer = &ka;
  ob.observer = &kb;
  const at::Tensor la = a.forward(x, oa), lb = b.forward(x, ob);
  EXPECT_EQ(ka.k, kb.k);
  EXPECT_EQ(ka.q, kb.q);
  EXPECT_GT((la - lb).abs().max().item<float>(), 1e-3);
  // Position 0 has no rotation, so its logits agree.
  EXPECT_LT((la[0][0] - lb[0][0]).abs().max().item<float>(), 1e-6);
}

// The whole forward of a tiny BF16 sharded Llama-3 / Qwen-YaRN model against the double reference
// forward (tests/model/hf_reference.hpp) given the frequencies computed above; negative control:
// the reference with scaling ignored is far outside the tolerance.
struct ScaledCase {
  const char* name;
  std::string family;
  nlohmann::json rope_scaling;
  std::vector<ld> inv_freq;
  double attention_factor;
};

TEST(RopeScalingForward, WholeModelMatchesDoubleReference) {
  const int hd = 16;
  const std::vector<ScaledCase> cases = {
      {"llama3", "llama",
       {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
        {"original_max_position_embeddings", 32}},
       {}, 1.0},
      {"yarn", "qwen3",
       {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32}},
       yarn_want(10000.0L, hd, 4, 32, 32, 1, true), 0.1 * std::log(4.0) + 1.0},
      {"linear", "qwen2", {{"type", "linear"}, {"factor", 3.0}}, {}, 1.0},
  };
  for (auto cs : cases) {
    SCOPED_TRACE(cs.name);
    hf::Spec spec;
    spec.family = cs.family;
    spec.head_dim = hd;
    spec.extra = {{"rope_scaling", cs.rope_scaling}};
    if (cs.inv_freq.empty()) {  // llama3 / linear, from the formulas as in the tests above
      for (int j = 0; j < hd / 2; ++j) {
        const ld f = base_freq(10000.0L, hd, j);
        if (std::string(cs.name) == "linear") {
          cs.inv_freq.push_back(f / 3);
          continue;
        }
        const ld period = 2 * kPi / f;
        if (period < 32.0L / 4) cs.inv_freq.push_back(f);
        else if (period > 32.0L) cs.inv_freq.push_back(f / 8);
        else {
          const ld t = (32 / period - 1) / 3;
          cs.inv_freq.push_back(f / 8 + t * (f - f / 8));
        }
      }
    }
    const hf::TensorMap w = hf::make_weights(spec);
    TempDir dir;
    hf::write_model(dir.str(), hf::make_config(spec), w, 2);
    const Model m = Model::load(dir.str());
    ref::Model r = ref::from_hf(spec, w);
    r.inv_freq.assign(cs.inv_freq.begin(), cs.inv_freq.end());
    r.attention_factor = cs.attention_factor;
    std::vector<int> ids;
    for (int t = 0; t < 48; ++t) ids.push_back((t * 11 + 5) % spec.vocab);  // past the 32 trained positions
    const ref::Vec want = ref::forward(r, ids);
    const at::Tensor logits =
        m.forward(at::tensor(std::vector<int64_t>(ids.begin(), ids.end()), at::kLong)).to(at::kDouble).contiguous();
    const ref::Vec got(logits.data_ptr<double>(), logits.data_ptr<double>() + logits.numel());
    EXPECT_LT(ref::rel_max_diff(got, want), 1e-4);
    // Greedy ids agree.
    for (size_t t = 0; t < ids.size(); ++t) {
      const auto row = [&](const ref::Vec& v) {
        return std::max_element(v.begin() + long(t * spec.vocab), v.begin() + long((t + 1) * spec.vocab)) - v.begin();
      };
      EXPECT_EQ(row(got), row(want)) << "position " << t;
    }
    ref::Model plain = r;
    plain.inv_freq = ref::default_inv_freq(spec.theta, hd);
    plain.attention_factor = 1.0;
    EXPECT_GT(ref::rel_max_diff(ref::forward(plain, ids), want), 1e-2) << "negative control: scaling ignored";
  }
}

}  // namespace
}  // namespace kvq
