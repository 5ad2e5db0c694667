// The streaming fp64 moments and everything derived from them, against a brute-force
// recomputation from the raw activations of real models (both RoPE pairing conventions).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kvq/model/model.hpp"
#include "kvq/stats/derived.hpp"
#include "kvq/stats/moments.hpp"
#include "shared_data.hpp"

using namespace kvq;

namespace {

struct Raw {  // every capture, copied
  std::vector<std::vector<float>> q, k, v;  // per layer: [N tokens][heads][d]
  std::vector<int64_t> pos;                 // per token
};

class Keep : public CaptureObserver {
 public:
  Raw raw;
  Moments* m = nullptr;
  void on_layer(const LayerCapture& c) override {
    if (raw.q.size() <= size_t(c.layer)) raw.q.resize(size_t(c.layer) + 1), raw.k.resize(size_t(c.layer) + 1),
        raw.v.resize(size_t(c.layer) + 1);
    size_t n = size_t(c.batch) * c.seq;
    raw.q[size_t(c.layer)].insert(raw.q[size_t(c.layer)].end(), c.q, c.q + n * c.n_heads * c.head_dim);
    raw.k[size_t(c.layer)].insert(raw.k[size_t(c.layer)].end(), c.k, c.k + n * c.n_kv_heads * c.head_dim);
    raw.v[size_t(c.layer)].insert(raw.v[size_t(c.layer)].end(), c.v, c.v + n * c.n_kv_heads * c.head_dim);
    if (c.layer == 0)
      for (int b = 0; b < c.batch; ++b) raw.pos.insert(raw.pos.end(), c.positions, c.positions + c.seq);
    if (m) m->accumulate(c);
  }
};

// Runs `batches` forward batches of random token windows, accumulating moments and raw copies.
void capture(const Model& model, int batches, int B, int T, Moments& m, Raw& raw) {
  Keep keep;
  keep.m = &m;
  std::mt19937 gen(123);
  std::uniform_int_distribution<int> tok(3, model.config().vocab_size - 1);
  for (int i = 0; i < batches; ++i) {
    at::Tensor ids = at::empty({B, T}, at::kLong);
    for (int j = 0; j < B * T; ++j) ids.data_ptr<int64_t>()[j] = j % T == 0 ? 1 : tok(gen);
    Model::ForwardOptions fo;
    fo.observer = &keep;
    fo.logits = false;
    model.forward(ids, fo);
  }
  raw = std::move(keep.raw);
}

// Compares streaming sums to long-double brute force, elementwise against the sum of |terms|.
void check_side(const SideMoments& s, const MomentShape& sh, const std::vector<std::vector<float>>& x, int heads,
                bool queries, const char* tag) {
  const int d = sh.head_dim, gs = sh.group_size();
  for (int l = 0; l < sh.n_layers; ++l)
    for (int h = 0; h < sh.n_kv_heads; ++h) {
      const auto& X = x[size_t(l)];
      const size_t N = X.size() / size_t(heads * d);
      std::vector<long double> sum(size_t(d), 0), gram(size_t(d * d), 0), asum(size_t(d), 0), agram(size_t(d * d), 0);
      int64_t count = 0;
      for (size_t t = 0; t < N; ++t)
        for (int g = queries ? h * gs : h; g < (queries ? (h + 1) * gs : h + 1); ++g) {
          const float* r = X.data() + (t * size_t(heads) + size_t(g)) * size_t(d);
          ++count;
          for (int i = 0; i < d; ++i) {
            sum[size_t(i)] += r[i];
            asum[size_t(i)] += std::fabs(r[i]);
            for (int j = 0; j < d; ++j) {
              gram[size_t(i * d + j)] += (long double)r[i] * r[j];
              agram[size_t(i * d + j)] += std::fabs((long double)r[i] * r[j]);
            }
          }
        }
      ASSERT_EQ(s.count_of(sh, l, h), count) << tag;
      const double* S = s.sum_of(sh, l, h);
      const double* G = s.gram_of(sh, l, h);
      for (int i = 0; i < d; ++i) {
        EXPECT_LE(std::fabs(S[i] - double(sum[size_t(i)])), 1e-10 * double(asum[size_t(i)]) + 1e-300)
            << tag << " sum l" << l << " h" << h << " i" << i;
        for (int j = 0; j < d; ++j)
          ASSERT_LE(std::fabs(G[i * d + j] - double(gram[size_t(i * d + j)])), 1e-10 * double(agram[size_t(i * d + j)]))
              << tag << " gram l" << l << " h" << h << " (" << i << "," << j << ")";
      }
    }
}

// Independent statement of the two conventions (DESIGN.md), not the library's rope_block_coords.
std::pair<int, int> pair_of(bool interleaved, int d, int i) {
  return interleaved ? std::make_pair(2 * i, 2 * i + 1) : std::make_pair(i, i + d / 2);
}

// Block energies summed token by token, optionally after rotating each block by pos * theta_i.
std::vector<double> direct_energies(const Raw& raw, const MomentShape& sh, int l, int h, bool interleaved,
                                    double base, bool post_rope) {
  const int d = sh.head_dim, nb = d / 2, gs = sh.group_size();
  std::vector<long double> eq(size_t(nb), 0), ek(size_t(nb), 0);
  const size_t N = raw.k[size_t(l)].size() / size_t(sh.n_kv_heads * d);
  auto blk = [&](const float* r, int i, int64_t pos) {
    auto [a, b] = pair_of(interleaved, d, i);
    long double x = r[a], y = r[b];
    if (post_rope) {
      long double th = (long double)pos * std::pow((long double)base, -2.0L * i / d);
      long double c = std::cos(th), s = std::sin(th);
      long double xr = x * c - y * s, yr = x * s + y * c;
      x = xr;
      y = yr;
    }
    return x * x + y * y;
  };
  for (size_t t = 0; t < N; ++t) {
    for (int g = h * gs; g < (h + 1) * gs; ++g)
      for (int i = 0; i < nb; ++i)
        eq[size_t(i)] += blk(raw.q[size_t(l)].data() + (t * size_t(sh.n_heads) + size_t(g)) * size_t(d), i, raw.pos[t]);
    for (int i = 0; i < nb; ++i)
      ek[size_t(i)] += blk(raw.k[size_t(l)].data() + (t * size_t(sh.n_kv_heads) + size_t(h)) * size_t(d), i, raw.pos[t]);
  }
  std::vector<double> e(static_cast<size_t>(nb));
  for (int i = 0; i < nb; ++i)
    e[size_t(i)] = double(0.5L * eq[size_t(i)] / (long double)(N * size_t(gs)) + 0.5L * ek[size_t(i)] / (long double)N);
  return e;
}

// max |x| per head of layer l, after rotating each block by pos * base^(-2i/d) when asked (the
// models here use unscaled RoPE over the whole head).
std::vector<double> direct_amax(const Raw& raw, const std::vector<std::vector<float>>& x, int heads, int d, int l,
                                bool interleaved, double base, bool post_rope) {
  std::vector<double> m(size_t(heads), 0.0);
  const auto& X = x[size_t(l)];
  const size_t N = X.size() / size_t(heads * d);
  for (size_t t = 0; t < N; ++t)
    for (int h = 0; h < heads; ++h) {
      const float* r = X.data() + (t * size_t(heads) + size_t(h)) * size_t(d);
      for (int i = 0; i < d / 2; ++i) {
        auto [a, b] = pair_of(interleaved, d, i);
        long double p = r[a], q = r[b];
        if (post_rope) {
          const long double th = (long double)raw.pos[t] * std::pow((long double)base, -2.0L * i / d);
          const long double pr = p * std::cos(th) - q * std::sin(th), qr = p * std::sin(th) + q * std::cos(th);
          p = pr;
          q = qr;
        }
        m[size_t(h)] = std::max({m[size_t(h)], double(std::fabs(p)), double(std::fabs(q))});
      }
    }
  return m;
}

void run_model(const std::string& path, bool interleaved) {
  Model model = Model::load(path);
  const auto& cfg = model.config();
  ASSERT_EQ(cfg.pairing == RopePairing::kInterleaved, interleaved) << "model's declared pairing";
  MomentShape sh{cfg.n_layers, cfg.n_kv_heads, cfg.n_heads, cfg.head_dim};
  Moments m(sh);
  {
    const RopeParams rp = rope_params(cfg, 48);
    m.set_amax_rope(cfg.pairing, cfg.rotary_dim, rp.inv_freq, rp.attention_factor);
  }
  Raw raw;
  capture(model, 2, 2, 48, m, raw);
  // Activation maxima: post-RoPE K and Q, V as is, per head, against the brute-force maxima.
  ASSERT_TRUE(m.has_amax());
  double k_moved = 0;
  for (int l = 0; l < cfg.n_layers; ++l) {
    const int d = cfg.head_dim;
    auto k = direct_amax(raw, raw.k, cfg.n_kv_heads, d, l, interleaved, cfg.rope_theta, true);
    auto k_pre = direct_amax(raw, raw.k, cfg.n_kv_heads, d, l, interleaved, cfg.rope_theta, false);
    auto v = direct_amax(raw, raw.v, cfg.n_kv_heads, d, l, interleaved, cfg.rope_theta, false);
    auto q = direct_amax(raw, raw.q, cfg.n_heads, d, l, interleaved, cfg.rope_theta, true);
    for (int h = 0; h < cfg.n_kv_heads; ++h) {
      const size_t i = size_t(l) * cfg.n_kv_heads + h;
      EXPECT_NEAR(m.k_amax[i], k[size_t(h)], 1e-6 * k[size_t(h)]) << "k amax l" << l << " h" << h;
      EXPECT_EQ(m.v_amax[i], float(v[size_t(h)])) << "v amax l" << l << " h" << h;
      k_moved = std::max(k_moved, std::fabs(k[size_t(h)] - k_pre[size_t(h)]) / k_pre[size_t(h)]);
    }
    for (int h = 0; h < cfg.n_heads; ++h)
      EXPECT_NEAR(m.q_amax[size_t(l) * cfg.n_heads + h], q[size_t(h)], 1e-6 * q[size_t(h)]) << "q amax l" << l << " h" << h;
  }
  EXPECT_GT(k_moved, 1e-3) << "post-RoPE K maxima equal the pre-RoPE ones: RoPE not applied?";
  // Merging takes the larger maximum; statistics without maxima make the merge lack them.
  Moments twice = m;
  twice.add(m);
  EXPECT_EQ(twice.k_amax, m.k_amax);
  Moments none(sh);
  none.add(m);
  EXPECT_FALSE(none.has_amax());
  check_side(m.k, sh, raw.k, cfg.n_kv_heads, false, "k");
  check_side(m.v, sh, raw.v, cfg.n_kv_heads, false, "v");
  check_side(m.q, sh, raw.q, cfg.n_heads, true, "q");

  RopeGeometry right{cfg.pairing, cfg.head_dim, cfg.rotary_dim};
  RopeGeometry wrong{interleaved ? RopePairing::kSplitHalf : RopePairing::kInterleaved, cfg.head_dim, cfg.rotary_dim};
  double moved = 0;
  for (int l = 0; l < cfg.n_layers; ++l)
    for (int h = 0; h < cfg.n_kv_heads; ++h) {
      auto e = block_energies(m, right, l, h);
      auto pre = direct_energies(raw, sh, l, h, interleaved, cfg.rope_theta, false);
      auto post = direct_energies(raw, sh, l, h, interleaved, cfg.rope_theta, true);
      auto other = block_energies(m, wrong, l, h);
      auto other_direct = direct_energies(raw, sh, l, h, !interleaved, cfg.rope_theta, false);
      for (size_t i = 0; i < e.size(); ++i) {
        EXPECT_NEAR(e[i], pre[i], 1e-10 * pre[i]) << "energy vs direct sum, l" << l << " h" << h << " block " << i;
        EXPECT_NEAR(post[i], pre[i], 1e-10 * pre[i]) << "RoPE changed block " << i << "'s energy";
        EXPECT_NEAR(other[i], other_direct[i], 1e-10 * other_direct[i]);
        moved = std::max(moved, std::fabs(other[i] - e[i]) / e[i]);
      }
    }
  // The pairing is not a relabelling: the same activations give different block energies.
  EXPECT_GT(moved, 0.1) << "energies did not move with the pairing convention";
}

}  // namespace

TEST(StatsBruteForce, Stories260KInterleaved) {
  KVQ_REQUIRE_SHARED("models/stories260K/stories260K.bin");
  run_model(test::shared_path("models/stories260K/stories260K.bin"), true);
}

TEST(StatsBruteForce, DemoModelSplitHalf) { run_model(std::string(KVQ_SOURCE_DIR) + "/data/kvq-demo-llama", false); }

TEST(Derived, EigenDecompositionReconstructsCovariance) {
  Model model = Model::load(std::string(KVQ_SOURCE_DIR) + "/data/kvq-demo-llama");
  const auto& cfg = model.config();
  MomentShape sh{cfg.n_layers, cfg.n_kv_heads, cfg.n_heads, cfg.head_dim};
  Moments m(sh);
  Raw raw;
  capture(model, 1, 2, 64, m, raw);
  for (bool centered : {true, false}) {
    Eigen::MatrixXd S = second_moment(m.k, sh, 1, 1, centered);
    auto e = eigen_decompose(S);
    for (int j = 1; j < e.values.size(); ++j) EXPECT_GE(e.values[j - 1], e.values[j]);
    Eigen::MatrixXd R = e.vectors * e.values.asDiagonal() * e.vectors.transpose();
    EXPECT_LT((R - S).norm(), 1e-9 * S.norm());
    EXPECT_LT((e.vectors.transpose() * e.vectors - Eigen::MatrixXd::Identity(sh.head_dim, sh.head_dim)).norm(), 1e-9);
    // Query variance along the K basis equals the direct variance of projected queries.
    Eigen::VectorXd sq = query_variance_in_basis(m, 1, 1, e.vectors, centered);
    Eigen::VectorXd mu_q = mean_of(m.q, sh, 1, 1);
    const int d = sh.head_dim, gs = sh.group_size();
    const size_t N = raw.q[1].size() / size_t(cfg.n_heads * d);
    for (int i = 0; i < 3; ++i) {
      long double acc = 0;
      for (size_t t = 0; t < N; ++t)
        for (int g = gs; g < 2 * gs; ++g) {
          const float* r = raw.q[1].data() + (t * size_t(cfg.n_heads) + size_t(g)) * size_t(d);
          long double p = 0;
          for (int c = 0; c < d; ++c) p += (long double)(r[c] - (centered ? mu_q[c] : 0.0)) * e.vectors(c, i);
          acc += p * p;
        }
      EXPECT_NEAR(sq[i], double(acc / (long double)(N * size_t(gs))), 1e-9 * sq[i]);
    }
  }
}
