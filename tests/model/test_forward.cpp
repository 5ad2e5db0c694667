// Forward mechanics: RoPE conventions and partial rotary, capture points, the KV transform hook,
// batching and positions, and a Qwen2-style synthetic model (q/k/v bias, partial rotary, GQA)
// checked against a plain scalar reference forward written here.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include <ATen/Parallel.h>

#include "kvq/model/model.hpp"
#include "model_test_util.hpp"

namespace kvq {
namespace {

const std::string kDemo = std::string(KVQ_SOURCE_DIR) + "/data/kvq-demo-llama";

std::vector<float> random_vec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g;
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

ModelConfig rope_cfg(RopePairing p, int d, int dr, double theta = 10000.0) {
  ModelConfig c;
  c.head_dim = d;
  c.rotary_dim = dr;
  c.pairing = p;
  c.rope_theta = theta;
  return c;
}

// Each rotated block (a, b) from rope_block_coords turns by pos * theta^(-2i/d_r); the tail is
// untouched; inverse undoes it.
void check_rope(RopePairing p, int d, int dr) {
  SCOPED_TRACE(std::string(to_string(p)) + " d=" + std::to_string(d) + " dr=" + std::to_string(dr));
  const ModelConfig c = rope_cfg(p, d, dr, 500000.0);
  const int T = 5, H = 3;
  const std::vector<int64_t> pos = {0, 1, 7, 100, 4095};
  const std::vector<float> x0 = random_vec(size_t(T) * H * d, 11);
  std::vector<float> x = x0;
  apply_rope(x.data(), H, T, d, pos.data(), c);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      const float* in = &x0[(size_t(t) * H + h) * d];
      const float* out = &x[(size_t(t) * H + h) * d];
      for (int i = 0; i < d / 2; ++i) {
        int a, b;
        rope_block_coords(p, d, dr, i, &a, &b);
        const double theta = i < dr / 2 ? std::pow(500000.0, -2.0 * i / dr) : 0.0;
        const double ang = double(pos[t]) * theta;
        const double ea = in[a] * std::cos(ang) - in[b] * std::sin(ang);
        const double eb = in[b] * std::cos(ang) + in[a] * std::sin(ang);
        EXPECT_NEAR(out[a], ea, 2e-5) << "t=" << t << " block " << i;
        EXPECT_NEAR(out[b], eb, 2e-5) << "t=" << t << " block " << i;
        // Rotation keeps each block's norm.
        EXPECT_NEAR(std::hypot(out[a], out[b]), std::hypot(in[a], in[b]), 1e-5);
        if (i >= dr / 2) {
          EXPECT_EQ(out[a], in[a]);
          EXPECT_EQ(out[b], in[b]);
        }
      }
    }
  apply_rope(x.data(), H, T, d, pos.data(), c, /*inverse=*/true);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], x0[i], 1e-5);
}

TEST(Rope, BlocksRotateByTheirFrequency) {
  for (RopePairing p : {RopePairing::kInterleaved, RopePairing::kSplitHalf}) {
    check_rope(p, 8, 8);
    check_rope(p, 64, 64);
    check_rope(p, 64, 32);  // partial rotary: half the dims untouched
    check_rope(p, 96, 24);
  }
}

TEST(Rope, WindowsVariantMatchesPerWindowCalls) {
  const ModelConfig c = rope_cfg(RopePairing::kSplitHalf, 16, 12);
  const int B = 3, T = 4, H = 2, d = 16;
  const std::vector<int64_t> pos = {5, 6, 7, 8};
  std::vector<float> a = random_vec(size_t(B) * T * H * d, 3), b = a;
  apply_rope_windows(a.data(), B, T, H, d, pos.data(), c);
  for (int w = 0; w < B; ++w) apply_rope(b.data() + size_t(w) * T * H * d, H, T, d, pos.data(), c);
  EXPECT_EQ(a, b);
}

// Records layer captures (copies) for checks after the forward returns.
struct Recorder : CaptureObserver {
  std::vector<LayerCapture> meta;
  std::vector<std::vector<float>> q, k, v;
  std::vector<std::vector<int64_t>> pos;
  void on_layer(const LayerCapture& c) override {
    meta.push_back(c);
    const size_t nq = size_t(c.batch) * c.seq * c.n_heads * c.head_dim;
    const size_t nk = size_t(c.batch) * c.seq * c.n_kv_heads * c.head_dim;
    q.emplace_back(c.q, c.q + nq);
    k.emplace_back(c.k, c.k + nk);
    v.emplace_back(c.v, c.v + nk);
    pos.emplace_back(c.positions, c.positions + c.seq);
  }
};

class DemoForward : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = new Model(Model::load(kDemo)); }
  static void TearDownTestSuite() { delete model_; }
  static at::Tensor ids(int B, int T, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int64_t> v(size_t(B) * T);
    for (auto& x : v) x = int64_t(rng() % 1024);
    return at::tensor(v, at::kLong).view({B, T});
  }
  static Model* model_;
};
Model* DemoForward::model_ = nullptr;

TEST_F(DemoForward, CaptureIsPreRopeProjection) {
  const int B = 2, T = 9;
  const at::Tensor x = ids(B, T, 1);
  Recorder rec;
  Model::ForwardOptions o;
  o.observer = &rec;
  o.pos0 = 3;
  model_->forward(x, o);
  ASSERT_EQ(rec.meta.size(), 4u);
  for (int l = 0; l < 4; ++l) {
    EXPECT_EQ(rec.meta[l].layer, l);
    EXPECT_EQ(rec.meta[l].batch, B);
    EXPECT_EQ(rec.meta[l].seq, T);
    EXPECT_EQ(rec.meta[l].n_heads, 4);
    EXPECT_EQ(rec.meta[l].n_kv_heads, 2);
    EXPECT_EQ(rec.meta[l].head_dim, 64);
    for (int t = 0; t < T; ++t) EXPECT_EQ(rec.pos[l][t], 3 + t);
  }
  // Layer 0 from the raw checkpoint: rmsnorm(embed[id]) * w_norm, then W x (+ no bias).
  const test::StMap st = test::st_read(kDemo + "/model.safetensors");
  const auto emb = test::as_floats(st.at("model.embed_tokens.weight"));
  const auto wn = test::as_floats(st.at("model.layers.0.input_layernorm.weight"));
  const auto wq = test::as_floats(st.at("model.layers.0.self_attn.q_proj.weight"));
  const auto wk = test::as_floats(st.at("model.layers.0.self_attn.k_proj.weight"));
  const auto wv = test::as_floats(st.at("model.layers.0.self_attn.v_proj.weight"));
  const int D = 256;
  double worst = 0;
  for (int n = 0; n < B * T; ++n) {
    const int64_t id = x.view({-1})[n].item<int64_t>();
    std::vector<double> h(D);
    double ss = 0;
    for (int j = 0; j < D; ++j) ss += double(emb[id * D + j]) * emb[id * D + j];
    const double inv = 1.0 / std::sqrt(ss / D + 1e-5);
    for (int j = 0; j < D; ++j) h[j] = emb[id * D + j] * inv * wn[j];
    auto check = [&](const std::vector<float>& w, const std::vector<float>& got, int rows) {
      for (int r = 0; r < rows; ++r) {
        double acc = 0;
        for (int j = 0; j < D; ++j) acc += w[size_t(r) * D + j] * h[j];
        worst = std::max(worst, std::abs(acc - got[size_t(n) * rows + r]));
      }
    };
    check(wq, rec.q[0], 256);
    check(wk, rec.k[0], 128);
    check(wv, rec.v[0], 128);
  }
  EXPECT_LT(worst, 1e-4);
}

TEST_F(DemoForward, CaptureOnlyPassSkipsLogits) {
  Recorder rec;
  Model::ForwardOptions o;
  o.observer = &rec;
  o.logits = false;
  EXPECT_FALSE(model_->forward(ids(1, 5, 2), o).defined());
  EXPECT_EQ(rec.meta.size(), 4u);
}

struct ZeroV : KvTransform {
  int calls = 0;
  void apply(LayerKv& kv) override {
    ++calls;
    EXPECT_EQ(kv.n_kv_heads, 2);
    EXPECT_EQ(kv.head_dim, 64);
    std::fill(kv.v, kv.v + size_t(kv.batch) * kv.seq * kv.n_kv_heads * kv.head_dim, 0.f);
  }
};
struct Identity : KvTransform {
  void apply(LayerKv&) override {}
};
// Captures k after a transform in a later forward: the transform must see the same pre-RoPE k.
struct KCopy : KvTransform {
  std::vector<std::vector<float>> k;
  void apply(LayerKv& kv) override {
    k.emplace_back(kv.k, kv.k + size_t(kv.batch) * kv.seq * kv.n_kv_heads * kv.head_dim);
  }
};

TEST_F(DemoForward, KvTransformHook) {
  const at::Tensor x = ids(2, 7, 4);
  const at::Tensor plain = model_->forward(x);
  Identity id;
  Model::ForwardOptions o;
  o.kv_transform = &id;
  EXPECT_TRUE(at::equal(plain, model_->forward(x, o)));

  Recorder rec;
  KCopy kc;
  o.observer = &rec;
  o.kv_transform = &kc;
  model_->forward(x, o);
  ASSERT_EQ(kc.k.size(), 4u);
  EXPECT_EQ(kc.k[2], rec.k[2]);

  ZeroV zero;
  Model::ForwardOptions z;
  z.kv_transform = &zero;
  const at::Tensor zeroed = model_->forward(x, z);
  EXPECT_EQ(zero.calls, 4);
  EXPECT_GT((zeroed - plain).abs().max().item<float>(), 0.1f);
}

// An observer may run the model itself (the forward's cached scratch must not be shared then),
// and a different shape afterwards must not disturb results.
TEST_F(DemoForward, ReentrantAndReshapedForwards) {
  struct Nested : CaptureObserver {
    const Model* m;
    at::Tensor inner;
    void on_layer(const LayerCapture& c) override {
      if (c.layer == 1) inner = m->forward(at::tensor(std::vector<int64_t>{1, 2, 3}, at::kLong));
    }
  } nested;
  nested.m = model_;
  const at::Tensor x = ids(2, 11, 8);
  const at::Tensor plain = model_->forward(x);
  Model::ForwardOptions o;
  o.observer = &nested;
  EXPECT_TRUE(at::equal(plain, model_->forward(x, o)));
  EXPECT_TRUE(at::equal(nested.inner, model_->forward(at::tensor(std::vector<int64_t>{1, 2, 3}, at::kLong))));
  EXPECT_TRUE(at::equal(plain, model_->forward(x)));
}

TEST_F(DemoForward, BatchRowsMatchSingleWindows) {
  const at::Tensor x = ids(3, 17, 5);
  const at::Tensor batched = model_->forward(x);
  for (int b = 0; b < 3; ++b) {
    const at::Tensor single = model_->forward(x[b]);
    EXPECT_LT((single[0] - batched[b]).abs().max().item<float>(), 1e-4) << "window " << b;
  }
}

// Attention sees only relative positions, so shifting pos0 leaves logits unchanged up to rounding.
TEST_F(DemoForward, PositionShiftInvariance) {
  const at::Tensor x = ids(1, 12, 6);
  Model::ForwardOptions o;
  o.pos0 = 100;
  EXPECT_LT((model_->forward(x) - model_->forward(x, o)).abs().max().item<float>(), 1e-3);
}

TEST_F(DemoForward, OneDimensionalIdsAndThreads) {
  const at::Tensor x = ids(1, 6, 7);
  const at::Tensor a = model_->forward(x);
  const int before = at::get_num_threads();
  EXPECT_EQ(set_threads(1), 1);
  const at::Tensor b = model_->forward(x[0]);
  EXPECT_GE(set_threads(0), 1);
  set_threads(before);
  // One thread vs all of them changes only the GEMM's blocking: float rounding, relative to the
  // logits' size (1.05e-5 absolute on an AMD EPYC at logits of ~15).
  const float scale = std::max(1.f, a.abs().max().item<float>());
  EXPECT_LT((a - b).abs().max().item<float>(), 2e-6f * scale);
}

// ---- Qwen2-style synthetic model against a scalar reference ---------------------------------

struct RefModel {
  test::TinySpec s;
  test::StMap w;
  std::vector<double> get(const std::string& name) const {
    const auto f = test::as_floats(w.at(name));
    return std::vector<double>(f.begin(), f.end());
  }
};

// y[r] = sum_j W[r][j] x[j] (+ b[r])
std::vector<double> matvec(const std::vector<double>& W, const std::vector<double>& x, size_t rows,
                           const std::vector<double>* b = nullptr) {
  std::vector<double> y(rows);
  for (size_t r = 0; r < rows; ++r) {
    double acc = b ? (*b)[r] : 0.0;
    for (size_t j = 0; j < x.size(); ++j) acc += W[r * x.size() + j] * x[j];
    y[r] = acc;
  }
  return y;
}

std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<double>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / x.size() + eps);
  std::vector<double> y(x.size());
  for (size_t j = 0; j < x.size(); ++j) y[j] = x[j] * inv * w[j];
  return y;
}

// RoPE on the first dr dims of one head vector: HF rotate_half pairs (i, i + dr/2); the
// interleaved variant pairs (2i, 2i+1) and serves as a negative control.
void rope_ref(double* v, int dr, double theta, int64_t pos, bool split_half) {
  for (int i = 0; i < dr / 2; ++i) {
    const double ang = double(pos) * std::pow(theta, -2.0 * i / dr);
    const int ia = split_half ? i : 2 * i, ib = split_half ? i + dr / 2 : 2 * i + 1;
    const double a = v[ia], b = v[ib];
    v[ia] = a * std::cos(ang) - b * std::sin(ang);
    v[ib] = b * std::cos(ang) + a * std::sin(ang);
  }
}

std::vector<std::vector<double>> reference_forward(const RefModel& m, const std::vector<int64_t>& ids, int64_t pos0,
                                                   bool split_half = true, bool full_rotary = false) {
  const auto& s = m.s;
  const size_t D = s.hidden, d = s.head_dim, H = s.heads, Hk = s.kv_heads, T = ids.size();
  const int dr = full_rotary ? s.head_dim : int(s.head_dim * s.partial_rotary);
  const auto emb = m.get("model.embed_tokens.weight");
  std::vector<std::vector<double>> x(T);
  for (size_t t = 0; t < T; ++t) x[t].assign(emb.begin() + ids[t] * D, emb.begin() + (ids[t] + 1) * D);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const auto wq = m.get(p + "self_attn.q_proj.weight"), wk = m.get(p + "self_attn.k_proj.weight"),
               wv = m.get(p + "self_attn.v_proj.weight"), wo = m.get(p + "self_attn.o_proj.weight"),
               bq = m.get(p + "self_attn.q_proj.bias"), bk = m.get(p + "self_attn.k_proj.bias"),
               bv = m.get(p + "self_attn.v_proj.bias"), n1 = m.get(p + "input_layernorm.weight"),
               n2 = m.get(p + "post_attention_layernorm.weight"), wg = m.get(p + "mlp.gate_proj.weight"),
               wu = m.get(p + "mlp.up_proj.weight"), wd = m.get(p + "mlp.down_proj.weight");
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (size_t t = 0; t < T; ++t) {
      const auto h = rmsnorm(x[t], n1, s.eps);
      q[t] = matvec(wq, h, H * d, &bq);
      k[t] = matvec(wk, h, Hk * d, &bk);
      v[t] = matvec(wv, h, Hk * d, &bv);
      for (size_t hh = 0; hh < H; ++hh) rope_ref(&q[t][hh * d], dr, s.theta, pos0 + int64_t(t), split_half);
      for (size_t hh = 0; hh < Hk; ++hh) rope_ref(&k[t][hh * d], dr, s.theta, pos0 + int64_t(t), split_half);
    }
    for (size_t t = 0; t < T; ++t) {
      std::vector<double> att(H * d, 0.0);
      for (size_t hh = 0; hh < H; ++hh) {
        const size_t kh = hh / (H / Hk);
        std::vector<double> sc(t + 1);
        double mx = -1e300;
        for (size_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (size_t i = 0; i < d; ++i) dot += q[t][hh * d + i] * k[j][kh * d + i];
          sc[j] = dot / std::sqrt(double(d));
          mx = std::max(mx, sc[j]);
        }
        double z = 0;
        for (auto& e : sc) z += (e = std::exp(e - mx));
        for (size_t j = 0; j <= t; ++j)
          for (size_t i = 0; i < d; ++i) att[hh * d + i] += sc[j] / z * v[j][kh * d + i];
      }
      const auto o = matvec(wo, att, D);
      for (size_t j = 0; j < D; ++j) x[t][j] += o[j];
      const auto h2 = rmsnorm(x[t], n2, s.eps);
      const auto g = matvec(wg, h2, s.inter), u = matvec(wu, h2, s.inter);
      std::vector<double> a(s.inter);
      for (int i = 0; i < s.inter; ++i) a[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      const auto dn = matvec(wd, a, D);
      for (size_t j = 0; j < D; ++j) x[t][j] += dn[j];
    }
  }
  const auto nf = m.get("model.norm.weight");
  const auto head = m.get(s.tied ? "model.embed_tokens.weight" : "lm_head.weight");
  std::vector<std::vector<double>> logits(T);
  for (size_t t = 0; t < T; ++t) logits[t] = matvec(head, rmsnorm(x[t], nf, s.eps), s.vocab);
  return logits;
}

TEST(Qwen2Synthetic, PartialRotaryBiasGqaMatchesScalarReference) {
  test::TempDir tmp;
  RefModel ref;
  ref.s.model_type = "qwen2";
  ref.s.qkv_bias = true;
  ref.s.partial_rotary = 0.5;  // rotary dim 8 of head_dim 16
  ref.s.head_dim = 16;
  ref.s.heads = 4;
  ref.s.kv_heads = 1;  // GQA 4:1
  ref.s.hidden = 24;   // != heads * head_dim: head_dim comes from the config
  ref.s.tied = true;
  ref.s.theta = 1000.0;
  ref.w = test::tiny_weights(ref.s);
  test::write_hf_dir(tmp / "q", test::tiny_config(ref.s), ref.w);
  const Model m = Model::load(tmp / "q");
  EXPECT_EQ(m.config().architecture, "qwen2");
  EXPECT_TRUE(m.config().qkv_bias);
  EXPECT_EQ(m.config().rotary_dim, 8);
  EXPECT_EQ(m.config().head_dim, 16);
  EXPECT_TRUE(m.config().tie_word_embeddings);

  const std::vector<int64_t> ids = {1, 17, 3, 33, 8, 8, 21, 39, 0, 12};
  Model::ForwardOptions o;
  o.pos0 = 5;
  const at::Tensor got = m.forward(at::tensor(ids, at::kLong), o)[0];
  auto max_diff = [&](const std::vector<std::vector<double>>& want) {
    double worst = 0;
    for (size_t t = 0; t < ids.size(); ++t)
      for (int vv = 0; vv < ref.s.vocab; ++vv)
        worst = std::max(worst, std::abs(double(got[int64_t(t)][vv].item<float>()) - want[t][vv]));
    return worst;
  };
  const double worst = max_diff(reference_forward(ref, ids, 5));
  EXPECT_LT(worst, 1e-3);
  std::cout << "[ info ] qwen2 synthetic max |logit diff| vs scalar fp64 reference = " << worst << "\n";
  // Negative controls: the check is sensitive to the pairing and to the rotary dim.
  EXPECT_GT(max_diff(reference_forward(ref, ids, 5, /*split_half=*/false)), 1e-2);
  EXPECT_GT(max_diff(reference_forward(ref, ids, 5, true, /*full_rotary=*/true)), 1e-2);
}

}  // namespace
}  // namespace kvq
