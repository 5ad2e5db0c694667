// Codec parity with the papers' reference (issue 14): an independent double-precision TurboQuant-MSE
// group codec, written here from the formulas, against kvq's per-layer RoPE-logit MAE on the same
// allocation (same groups, bits, rotation kind, norm correction), on the held-out windows of small
// calibrations (16 x 128, 4 held-out windows) of the demo model and stories260K at K2 and K3, for
// uniform TQ-MSE and Block-GTQ. The reference, per group D (m coordinates, b bits):
//   rho = ||x_D||, u = Pi x_D / rho, c_i = the Lloyd-Max centroid nearest u_i for N(0, 1/m),
//   x^_D = rho Pi^T (c / ||c||)   (norm correction; rho Pi^T c without it),
// with the Lloyd-Max codebook computed here from the Gaussian density by Lloyd's iteration, and Pi
// the identity where the allocation records it, else a Haar rotation. The metric, as kvq-verify
// defines it: per layer, the mean over (KV head, held-out window, query head of its group, query i,
// attended key j: causal, within the layer's sliding window) of |q_i . (k_j - k^_j)| / sqrt(d),
// q and k post-RoPE at the window's positions (RoPE in double, written here).
// Two comparisons, both against kvq's codec:
//  - paired: the reference's math on kvq's own rotation matrices vs `kvq-verify --json`: only the
//    codec math differs. Asserted within 2% on both models (measured: within 0.3%, the fp16 norm).
//  - unpaired: the reference with Haar rotations drawn here (QR of a Gaussian matrix, R's diagonal
//    made positive) vs kvq's codec with other rotation seeds, each averaged over 64 draws (this
//    file's metric over kvq's codec is first checked equal to kvq-verify's figure, 1e-4). On the demo
//    model (d = 64) the draw-to-draw spread is small enough to assert 2%. On stories260K (d = 8,
//    groups of 2-8 coordinates) one draw moves a layer's MAE by ~10%, so 64 draws leave a standard
//    error of the ratio of 1.5-2.5%: 2% cannot be resolved there within the test's time (it would
//    take ~500 draws a side); its table is printed with standard errors and checked for consistency
//    (difference within 4 standard errors) only.
#include <gtest/gtest.h>

#include <Eigen/Dense>

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "kvq/codec/codec.hpp"
#include "kvq/io/alloc_file.hpp"
#include "kvq/io/calib_file.hpp"
#include "pipeline_fixture.hpp"
#include "run_cmd.hpp"
#include "shared_data.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;
using kvq::test::bin;
using kvq::test::run_cmd;
using kvq::test::temp_path;
using namespace kvq::test::pipeline;

namespace {

// Rotation draws of kvq's codec and of the reference; KVQ_PARITY_DRAWS=K,R overrides.
void read_seeds(int* kvq_draws, int* ref_draws) {
  if (const char* e = std::getenv("KVQ_PARITY_DRAWS")) std::sscanf(e, "%d,%d", kvq_draws, ref_draws);
}
constexpr double kTolerance = 0.02;

// ---- Lloyd-Max codebook of N(0, 1), by Lloyd's iteration on the density ----
double pdf(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI); }
double cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

const std::vector<double>& lloyd_max(int b) {
  static std::map<int, std::vector<double>> cache;
  auto it = cache.find(b);
  if (it != cache.end()) return it->second;
  const int n = 1 << b;
  std::vector<double> c(static_cast<size_t>(n)), t(static_cast<size_t>(n) + 1);
  for (int i = 0; i < n; ++i) {  // start at the quantiles (i + 1/2) / n, by bisection on the cdf
    double lo = -12, hi = 12, p = (i + 0.5) / n;
    for (int k = 0; k < 200; ++k) ((cdf(0.5 * (lo + hi)) < p) ? lo : hi) = 0.5 * (lo + hi);
    c[size_t(i)] = 0.5 * (lo + hi);
  }
  for (int iter = 0; iter < 100000; ++iter) {
    t[0] = -INFINITY, t[size_t(n)] = INFINITY;
    for (int i = 1; i < n; ++i) t[size_t(i)] = 0.5 * (c[size_t(i) - 1] + c[size_t(i)]);
    double change = 0;
    for (int i = 0; i < n; ++i) {
      const double a = t[size_t(i)], z = t[size_t(i) + 1];
      const double mass = cdf(z) - cdf(a);
      const double mean = ((std::isinf(a) ? 0 : pdf(a)) - (std::isinf(z) ? 0 : pdf(z))) / mass;
      change = std::max(change, std::fabs(mean - c[size_t(i)]));
      c[size_t(i)] = mean;
    }
    if (change < 1e-13) break;
  }
  return cache[b] = c;
}

// ---- Haar rotation: QR of a Gaussian matrix, columns signed so R's diagonal is positive ----
Eigen::MatrixXd haar(int m, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> g;
  Eigen::MatrixXd G(m, m);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < m; ++j) G(i, j) = g(rng);
  Eigen::HouseholderQR<Eigen::MatrixXd> qr(G);
  Eigen::MatrixXd Q = qr.householderQ();
  const Eigen::MatrixXd R = qr.matrixQR();
  for (int j = 0; j < m; ++j)
    if (R(j, j) < 0) Q.col(j) *= -1;
  return Q;
}

// ---- RoPE in double (full rotary dim), pairing from the calibration's provenance ----
void rope(double* x, int d, int64_t pos, const kvq::CalibProvenance& p) {
  for (int i = 0; i < d / 2; ++i) {
    const double f = p.rope_inv_freq.empty() ? std::pow(p.rope_theta, -2.0 * i / d) : p.rope_inv_freq[size_t(i)];
    const double c = p.rope_attention_factor * std::cos(double(pos) * f),
                 s = p.rope_attention_factor * std::sin(double(pos) * f);
    const int a = p.pairing == kvq::RopePairing::kInterleaved ? 2 * i : i;
    const int b = p.pairing == kvq::RopePairing::kInterleaved ? 2 * i + 1 : i + d / 2;
    const double xa = x[a], xb = x[b];
    x[a] = xa * c - xb * s;
    x[b] = xa * s + xb * c;
  }
}

// One group coded and decoded in place: x (m values) -> x^.
void code_group(double* x, int m, int bits, const Eigen::MatrixXd* Pi, bool norm_correction) {
  Eigen::Map<Eigen::VectorXd> v(x, m);
  const double rho = v.norm();
  if (rho == 0) return;
  Eigen::VectorXd u = Pi ? Eigen::VectorXd(*Pi * v / rho) : Eigen::VectorXd(v / rho);
  const auto& cb = lloyd_max(bits);
  const double scale = 1 / std::sqrt(double(m));
  for (int i = 0; i < m; ++i) {
    double best = 0, err = INFINITY;
    for (double c : cb)
      if (std::fabs(u[i] - c * scale) < err) err = std::fabs(u[i] - c * scale), best = c * scale;
    u[i] = best;
  }
  if (norm_correction) u /= u.norm();
  v = Pi ? Eigen::VectorXd(rho * Pi->transpose() * u) : Eigen::VectorXd(rho * u);
}

// The held-out windows in double, post-RoPE (keys also pre-RoPE), per (layer, window, head).
struct Heldout {
  int L = 0, H = 0, NH = 0, d = 0, M = 0, T = 0;
  std::vector<int> window;                      // per layer, 0 = full causal
  std::vector<Eigen::MatrixXd> kpre, kpost, q;  // [(l*M + w)*H + h] and [(l*M + w)*NH + qh], [T][d]
};

Heldout heldout(const kvq::CalibFile& c) {
  const auto& p = c.prov;
  Heldout x;
  x.L = p.n_layers, x.H = p.n_kv_heads, x.NH = p.n_heads, x.d = p.head_dim, x.M = c.holdout.windows, x.T = p.seq_len;
  EXPECT_TRUE(p.rotary_dim == 0 || p.rotary_dim == x.d) << "the reference's RoPE covers full rotary dims only";
  const int d = x.d, T = x.T;
  for (int l = 0; l < x.L; ++l) {
    x.window.push_back(p.window_of(l));
    for (int w = 0; w < x.M; ++w) {
      auto rows = [&](const kvq::payload::FloatVector& src, int heads, int h, bool post) {
        Eigen::MatrixXd m(T, d);
        for (int t = 0; t < T; ++t) {
          const float* r = src.data() + (((size_t(l) * x.M + w) * T + t) * heads + h) * d;
          std::vector<double> v(r, r + d);
          if (post) rope(v.data(), d, c.holdout.positions[size_t(t)], p);
          for (int i = 0; i < d; ++i) m(t, i) = v[size_t(i)];
        }
        return m;
      };
      for (int h = 0; h < x.H; ++h) {
        x.kpre.push_back(rows(c.holdout.k, x.H, h, false));
        x.kpost.push_back(rows(c.holdout.k, x.H, h, true));
      }
      for (int qh = 0; qh < x.NH; ++qh) x.q.push_back(rows(c.holdout.q, x.NH, qh, true));
    }
  }
  return x;
}

// Codes one head's held-out keys: (pre-RoPE, post-RoPE) [T][d] -> decoded post-RoPE [T][d].
using HeadCoder = std::function<Eigen::MatrixXd(const Eigen::MatrixXd&, const Eigen::MatrixXd&)>;
// Builds the coder of (draw, layer, head, K decision).
using MakeCoder = std::function<HeadCoder(int, int, int, const kvq::HeadDecision&)>;

// Per-layer logit MAE of each draw, as kvq-verify defines it: [draw][layer].
std::vector<std::vector<double>> layer_mae(const Heldout& x, const kvq::AllocFile& a, int draws, const MakeCoder& make) {
  std::vector<std::vector<double>> out(size_t(draws), std::vector<double>(size_t(x.L), 0));
  const int gs = x.NH / x.H;
  for (int l = 0; l < x.L; ++l)
    for (int s = 0; s < draws; ++s) {
      double sum = 0, pairs = 0;
      for (int h = 0; h < x.H; ++h) {
        const kvq::HeadDecision* kd = nullptr;
        for (const auto& hd : a.heads)
          if (hd.layer == l && hd.kv_head == h && hd.side == kvq::Side::kK) kd = &hd;
        EXPECT_TRUE(kd && kd->kind == kvq::CodingKind::kTqGroups);
        if (!kd) return {};
        const HeadCoder code = make(s, l, h, *kd);
        for (int w = 0; w < x.M; ++w) {
          const size_t kh = (size_t(l) * x.M + w) * x.H + h;
          const Eigen::MatrixXd E = x.kpost[kh] - code(x.kpre[kh], x.kpost[kh]);
          for (int qh = h * gs; qh < (h + 1) * gs; ++qh) {
            const Eigen::MatrixXd S = x.q[(size_t(l) * x.M + w) * x.NH + qh] * E.transpose() / std::sqrt(double(x.d));
            for (int i = 0; i < x.T; ++i) {
              const int lo = x.window[size_t(l)] > 0 ? std::max(0, i - x.window[size_t(l)] + 1) : 0;
              for (int j = lo; j <= i; ++j) sum += std::fabs(S(i, j));
              pairs += i - lo + 1;
            }
          }
        }
      }
      out[size_t(s)][size_t(l)] = sum / pairs;
    }
  return out;
}

// The reference codec: this file's Haar draws (or the identity where the allocation says so),
// Lloyd-Max codebook, norm correction as the allocation records it.
// draw < 0: "paired", the reference's math with kvq's own rotation matrices (the allocation's
// seeds), so that only the codec math differs.
HeadCoder reference_coder(int draw, int l, int h, const kvq::HeadDecision& kd, const kvq::CalibProvenance& p,
                          const std::vector<int64_t>& positions) {
  auto rot = std::make_shared<std::vector<Eigen::MatrixXd>>();
  std::unique_ptr<kvq::codec::HeadCodec> kc;
  if (draw < 0) kc = std::make_unique<kvq::codec::HeadCodec>(kd, p.head_dim);
  for (size_t g = 0; g < kd.groups.size(); ++g) {
    const int m = int(kd.groups[g].dims.size());
    if (kd.groups[g].rotation == kvq::TqRotation::kIdentity) {
      rot->push_back(Eigen::MatrixXd());
    } else if (draw < 0) {
      const auto& kvq_pi = kc->tq_groups()[g].rotation->matrix;  // row-major, u = Pi x
      Eigen::MatrixXd Pi(m, m);
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < m; ++j) Pi(i, j) = kvq_pi[size_t(i) * m + j];
      rot->push_back(Pi);
    } else {
      rot->push_back(haar(m, 0x9e3779b97f4a7c15ull * uint64_t(1 + draw) + uint64_t(l) * 7919 + uint64_t(h) * 104729 + g));
    }
  }
  return [rot, kd, &p, &positions](const Eigen::MatrixXd& pre, const Eigen::MatrixXd& post) {
    Eigen::MatrixXd out = kd.post_rope ? post : pre;
    const int d = int(out.cols());
    for (int t = 0; t < out.rows(); ++t) {
      std::vector<double> row(static_cast<size_t>(d));
      for (int i = 0; i < d; ++i) row[size_t(i)] = out(t, i);
      for (size_t g = 0; g < kd.groups.size(); ++g) {
        const auto& G = kd.groups[g];
        std::vector<double> xg(G.dims.size());
        for (size_t i = 0; i < xg.size(); ++i) xg[i] = row[size_t(G.dims[i])];
        code_group(xg.data(), int(xg.size()), G.bits, (*rot)[g].size() ? &(*rot)[g] : nullptr, kd.norm_correction);
        for (size_t i = 0; i < xg.size(); ++i) row[size_t(G.dims[i])] = xg[i];
      }
      if (!kd.post_rope) rope(row.data(), d, positions[size_t(t)], p);
      for (int i = 0; i < d; ++i) out(t, i) = row[size_t(i)];
    }
    return out;
  };
}

// kvq's codec (codec::HeadCodec round trip, fp32 in and out) on the same decision; draw < 0 keeps
// the allocation's rotation seeds, draw >= 0 gives each group another seed (another kvq Haar draw).
HeadCoder kvq_coder(int draw, const kvq::HeadDecision& kd0, const kvq::CalibProvenance& p,
                    const std::vector<int64_t>& positions) {
  kvq::HeadDecision kd = kd0;
  if (draw >= 0)
    for (auto& g : kd.groups) g.rotation_seed = g.rotation_seed * 6364136223846793005ull + 1442695040888963407ull * uint64_t(draw + 1);
  auto codec = std::make_shared<kvq::codec::HeadCodec>(kd, p.head_dim);
  const bool post_rope = kd.post_rope;
  return [codec, post_rope, &p, &positions](const Eigen::MatrixXd& pre, const Eigen::MatrixXd& post) {
    const Eigen::MatrixXd& in = post_rope ? post : pre;
    const int T = int(in.rows()), d = int(in.cols());
    std::vector<float> x(size_t(T) * d), y(x.size());
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < d; ++i) x[size_t(t) * d + i] = float(in(t, i));
    codec->round_trip(x.data(), T, y.data());
    Eigen::MatrixXd out(T, d);
    for (int t = 0; t < T; ++t) {
      std::vector<double> row(y.begin() + long(t) * d, y.begin() + long(t + 1) * d);
      if (!post_rope) rope(row.data(), d, positions[size_t(t)], p);
      for (int i = 0; i < d; ++i) out(t, i) = row[size_t(i)];
    }
    return out;
  };
}

std::vector<double> kvq_verify_mae(const std::string& cal, const std::string& alloc) {
  auto out = temp_path("rp_verify.json");
  fs::remove(out);
  auto r = run_cmd(bin("kvq-verify") + " -q --no-cuda --calib " + cal + " --alloc " + alloc + " --json " + out);
  EXPECT_EQ(r.status, 0) << r.err;
  std::vector<double> v;
  if (!fs::exists(out)) return v;
  const json j = json::parse(std::ifstream(out));
  for (const auto& l : j["allocation"]["layers"]) v.push_back(l["logit_mae"].get<double>());
  return v;
}

struct MeanSe {
  double mean = 0, se = 0;
};
MeanSe mean_se(const std::vector<std::vector<double>>& v, size_t l) {
  MeanSe r;
  const double n = double(v.size());
  for (const auto& x : v) r.mean += x[l] / n;
  double var = 0;
  for (const auto& x : v) var += (x[l] - r.mean) * (x[l] - r.mean) / std::max(1.0, n - 1);
  r.se = std::sqrt(var / n);
  return r;
}

// assert_unpaired: whether the comparison over independent rotation draws is asserted (else printed).
void parity(const std::string& cal_path, const std::string& model, int kvq_draws, int ref_draws, bool assert_unpaired) {
  read_seeds(&kvq_draws, &ref_draws);
  const kvq::CalibFile c = kvq::read_calib(cal_path, true);
  const Heldout x = heldout(c);
  const auto& p = c.prov;
  const auto& pos = c.holdout.positions;
  for (const char* method : {"uniform", "block-gtq"})
    for (int b : {2, 3}) {
      const auto alloc = temp_path("rp.kvqalloc.h5");
      auto r = run_cmd(bin("kvq-allocate") + " -q --calib " + cal_path + " --out " + alloc + " --method " + method +
                       " --bpd " + std::to_string(b) + " --group-norms fp16");  // the reference's side information
      ASSERT_EQ(r.status, 0) << r.err;
      const kvq::AllocFile a = kvq::read_alloc(alloc);
      const std::string what = model + " " + method + " K" + std::to_string(b);
      // kvq's figure as kvq-verify reports it, and this file's metric over kvq's codec with the
      // allocation's own rotations: the same numbers (fp32 GEMM vs double: 1e-4).
      const auto verify = kvq_verify_mae(cal_path, alloc);
      const auto same = layer_mae(x, a, 1, [&](int, int, int, const kvq::HeadDecision& kd) {
        return kvq_coder(-1, kd, p, pos);
      });
      ASSERT_EQ(verify.size(), size_t(x.L));
      ASSERT_EQ(same.size(), 1u);
      for (int l = 0; l < x.L; ++l)
        EXPECT_NEAR(same[0][size_t(l)] / verify[size_t(l)], 1.0, 1e-4) << what << " layer " << l;
      // Paired: the reference's math on kvq's own rotation matrices, against kvq-verify.
      const auto paired = layer_mae(x, a, 1, [&](int, int l, int h, const kvq::HeadDecision& kd) {
        return reference_coder(-1, l, h, kd, p, pos);
      });
      // Unpaired: both codecs over many rotation draws, kvq's Haar matrices from other seeds, the
      // reference's its own.
      const auto kv = layer_mae(x, a, kvq_draws, [&](int s, int, int, const kvq::HeadDecision& kd) {
        return kvq_coder(s, kd, p, pos);
      });
      const auto ref = layer_mae(x, a, ref_draws, [&](int s, int l, int h, const kvq::HeadDecision& kd) {
        return reference_coder(s, l, h, kd, p, pos);
      });
      std::printf("%s per-layer RoPE-logit MAE. paired: kvq-verify vs the reference on kvq's rotations; "
                  "unpaired: means over rotation draws (reference %d, kvq %d; +- standard error)%s\n"
                  "  layer | paired: reference  kvq-verify  ratio | unpaired: reference          kvq                  ratio\n",
                  what.c_str(), ref_draws, kvq_draws, assert_unpaired ? "" : " [unpaired printed, not asserted]");
      for (int l = 0; l < x.L; ++l) {
        const MeanSe R = mean_se(ref, size_t(l)), K = mean_se(kv, size_t(l));
        const double pr = verify[size_t(l)] / paired[0][size_t(l)], ratio = K.mean / R.mean;
        std::printf("  %5d | %9.5f %9.5f  %7.4f | %8.5f +- %7.5f  %8.5f +- %7.5f  %7.4f\n", l, paired[0][size_t(l)],
                    verify[size_t(l)], pr, R.mean, R.se, K.mean, K.se, ratio);
        EXPECT_NEAR(pr, 1.0, kTolerance) << what << " layer " << l << ": kvq-verify's logit MAE " << verify[size_t(l)]
                                         << " is not within 2% of the reference codec's " << paired[0][size_t(l)]
                                         << " on the same rotations (issue 14)";
        if (assert_unpaired) {
          EXPECT_NEAR(ratio, 1.0, kTolerance)
              << what << " layer " << l << ": kvq's mean logit MAE " << K.mean
              << " is not within 2% of the reference codec's " << R.mean << " over independent Haar draws (issue 14)";
        } else {
          EXPECT_LE(std::fabs(K.mean - R.mean), 4 * std::sqrt(K.se * K.se + R.se * R.se))
              << what << " layer " << l << ": kvq's mean logit MAE " << K.mean << " and the reference's " << R.mean
              << " differ by more than 4 standard errors of the draws";
        }
      }
    }
}

}  // namespace

// The codebook of this file against the published Lloyd-Max MSE of N(0,1) (REFERENCE-FACTS).
TEST(ReferenceCodecParity, LloydMaxCodebookMatchesThePublishedMse) {
  const double table[] = {0, 0.3634, 0.1175, 0.03455, 0.009501};
  for (int b = 1; b <= 4; ++b) {
    const auto& c = lloyd_max(b);
    double mse = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      const double a = i == 0 ? -INFINITY : 0.5 * (c[i - 1] + c[i]);
      const double z = i + 1 == c.size() ? INFINITY : 0.5 * (c[i] + c[i + 1]);
      // E[(x - c)^2; a < x < z] = (1 + c^2) P - 2 c (pdf(a) - pdf(z)) + (a pdf(a) - z pdf(z)).
      const double pa = std::isinf(a) ? 0 : pdf(a), pz = std::isinf(z) ? 0 : pdf(z);
      const double apa = std::isinf(a) ? 0 : a * pa, zpz = std::isinf(z) ? 0 : z * pz;
      mse += (1 + c[i] * c[i]) * (cdf(z) - cdf(a)) - 2 * c[i] * (pa - pz) + (apa - zpz);
    }
    EXPECT_NEAR(mse, table[b], 5e-4) << "b=" << b;
  }
}

TEST(ReferenceCodecParity, Demo) {
  std::string cal = demo_cal("rp", 4);
  if (cal.empty()) GTEST_SKIP() << "needs `bible` (Debian bible-kjv)";
  parity(cal, "kvq-demo-llama", 64, 64, true);
}

TEST(ReferenceCodecParity, Stories260K) {
  KVQ_REQUIRE_SHARED("models/stories260K/stories260K.bin");
  parity(stories_cal("rp", 4), "stories260K", 64, 64, false);
}
