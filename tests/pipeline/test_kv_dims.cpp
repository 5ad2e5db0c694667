// MLA's served cache through the pipeline without a model: a 576-dim key (64 rotary dims, adjacent
// pairs, then the 512-dim latent), a 512-dim value (the latent), 16 query heads on 1 KV head and
// the softmax scale 192^-1/2 * mscale^2. Synthetic LayerCapture rows go through Moments into a
// calibration file (version 5), every allocation method, and kvq-verify's metrics, each checked
// against sums written here from the definitions. Also: the previous layout (version 3) still
// reads with V at head_dim and scale 1/sqrt(head_dim), and dims that disagree are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kvq/codec/attention.hpp"
#include "kvq/codec/codec.hpp"
#include "kvq/io/alloc_file.hpp"
#include "kvq/io/calib_file.hpp"
#include "kvq/pipeline/allocate.hpp"
#include "kvq/pipeline/verify.hpp"
#include "kvq/util/error.hpp"
#include "run_cmd.hpp"

namespace fs = std::filesystem;
using namespace kvq;
using kvq::test::temp_path;

namespace {

constexpr int kL = 2, kNq = 16, kH = 1, kD = 576, kDv = 512, kRot = 64, kT = 12, kCalWin = 2, kHoldWin = 1;
// DeepSeek-V2-Lite: qk_head_dim 192, YaRN factor 40, mscale_all_dim 0.707.
const double kScale = std::pow(192.0, -0.5) * std::pow(0.1 * 0.707 * std::log(40.0) + 1.0, 2);

struct Rows {  // one window: [T][heads][dim]
  std::vector<float> q, k, v;
};

// Rows with a decaying spectrum (so the bases are well defined); V is the key's latent part, as
// in MLA's served cache (the key is [k_pe, c~], the value c~).
Rows make_rows(std::mt19937& rng, int dv) {
  std::normal_distribution<float> n01(0.f, 1.f);
  Rows r;
  r.q.resize(size_t(kT) * kNq * kD);
  r.k.resize(size_t(kT) * kH * kD);
  r.v.resize(size_t(kT) * kH * dv);
  auto amp = [](int i) { return float(2.0 / (1.0 + 0.02 * i)); };
  for (int t = 0; t < kT; ++t) {
    const float common = n01(rng);
    for (int i = 0; i < kD; ++i) r.k[size_t(t) * kD + i] = amp(i) * n01(rng) + (i % 7 == 0 ? common : 0.f);
    for (int h = 0; h < kNq; ++h)
      for (int i = 0; i < kD; ++i) r.q[(size_t(t) * kNq + h) * kD + i] = amp(i) * n01(rng) * 0.5f;
    for (int i = 0; i < dv; ++i) r.v[size_t(t) * dv + i] = r.k[size_t(t) * kD + (kD - dv) + i];
  }
  return r;
}

struct Synth {
  CalibFile c;
  std::vector<Rows> calib[kL];  // per layer, per calibration window
};

// dv == kD and scale 0: the defaults (every existing family).
Synth make_synth(int dv, double scale, uint32_t seed = 7) {
  Synth s;
  CalibFile& c = s.c;
  auto& p = c.prov;
  p.tool_version = "test";
  p.model_path = "synthetic-mla";
  p.model_config_sha256 = std::string(64, 'd');
  p.architecture = "deepseek_v2";
  p.pairing = RopePairing::kInterleaved;  // adjacent pairs (2i, 2i+1)
  p.rotary_dim = kRot;
  p.rope_theta = 10000;
  p.rope_inv_freq = rope_default_inv_freq(p.rope_theta, kRot);
  p.head_dim = kD;
  p.head_dim_v = dv == kD ? 0 : dv;
  p.softmax_scale = scale;
  p.n_layers = kL;
  p.n_heads = kNq;
  p.n_kv_heads = kH;
  p.gqa_map.assign(kNq, 0);
  p.layer_window.assign(kL, 0);
  p.corpus = {{"c.txt", std::string(64, 'b'), 100, 0}};
  p.seq_len = kT;
  p.samples = kCalWin;
  p.holdout = kHoldWin;
  p.batch_size = 1;
  p.reservoir_tokens = kCalWin * kT;
  const MomentShape sh{kL, kH, kNq, kD, p.head_dim_v};
  c.moments = Moments(sh);
  track_amax_with(c.moments, p);
  std::vector<int64_t> pos(kT);
  for (int t = 0; t < kT; ++t) pos[size_t(t)] = t;
  std::mt19937 rng(seed);
  // Reservoir: every calibration token, [n][L][heads][dim].
  const int n = kCalWin * kT;
  c.reservoir.capacity = n;
  c.reservoir.seen = n;
  c.reservoir.q.assign(size_t(n) * kL * kNq * kD, 0.f);
  c.reservoir.k.assign(size_t(n) * kL * kH * kD, 0.f);
  c.reservoir.v.assign(size_t(n) * kL * kH * dv, 0.f);
  for (int w = 0; w < kCalWin; ++w)
    for (int t = 0; t < kT; ++t) c.reservoir.source.insert(c.reservoir.source.end(), {w, t});
  for (int w = 0; w < kCalWin; ++w)
    for (int l = 0; l < kL; ++l) {
      Rows r = make_rows(rng, dv);
      LayerCapture lc;
      lc.layer = l;
      lc.batch = 1;
      lc.seq = kT;
      lc.n_heads = kNq;
      lc.n_kv_heads = kH;
      lc.head_dim = kD;
      lc.head_dim_v = p.head_dim_v;
      lc.q = r.q.data();
      lc.k = r.k.data();
      lc.v = r.v.data();
      lc.positions = pos.data();
      c.moments.accumulate(lc);
      for (int t = 0; t < kT; ++t) {
        const size_t row = size_t(w * kT + t) * kL + size_t(l);
        std::copy_n(r.q.data() + size_t(t) * kNq * kD, kNq * kD, c.reservoir.q.data() + row * kNq * kD);
        std::copy_n(r.k.data() + size_t(t) * kD, kD, c.reservoir.k.data() + row * kD);
        std::copy_n(r.v.data() + size_t(t) * dv, dv, c.reservoir.v.data() + row * dv);
      }
      s.calib[l].push_back(std::move(r));
    }
  c.calib_offsets = {0, kT};
  c.holdout_offsets = {2 * kT};
  c.windows_done = kCalWin;
  // Held-out windows: [L][M][T][heads][dim].
  c.holdout.windows = kHoldWin;
  c.holdout.ids.assign(size_t(kHoldWin) * kT, 1);
  c.holdout.positions = pos;
  c.holdout.q.assign(size_t(kL) * kHoldWin * kT * kNq * kD, 0.f);
  c.holdout.k.assign(size_t(kL) * kHoldWin * kT * kH * kD, 0.f);
  c.holdout.v.assign(size_t(kL) * kHoldWin * kT * kH * dv, 0.f);
  for (int l = 0; l < kL; ++l) {
    Rows r = make_rows(rng, dv);
    std::copy(r.q.begin(), r.q.end(), c.holdout.q.begin() + std::ptrdiff_t(size_t(l) * r.q.size()));
    std::copy(r.k.begin(), r.k.end(), c.holdout.k.begin() + std::ptrdiff_t(size_t(l) * r.k.size()));
    std::copy(r.v.begin(), r.v.end(), c.holdout.v.begin() + std::ptrdiff_t(size_t(l) * r.v.size()));
  }
  return s;
}

std::string dir() {
  const std::string d = temp_path("kv_dims");
  fs::create_directories(d);
  return d;
}

const Synth& mla() {
  static const Synth s = [] {
    Synth x = make_synth(kDv, kScale);
    write_calib(dir() + "/mla.kvqcal.h5", x.c);
    return x;
  }();
  return s;
}
std::string mla_path() {
  mla();
  return dir() + "/mla.kvqcal.h5";
}

std::string one_line_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

AllocFile allocate(Method k, Method v, const std::string& out, double bpd = 3) {
  AllocateOptions o;
  o.calib = mla_path();
  o.out = out;
  o.method = k;
  o.v_method = v;
  o.bpd = bpd;
  o.v_bpd = bpd;
  o.threads = 1;
  o.measure_tokens = kCalWin * kT;
  o.r_min = 480;  // cobra-measured codes every (rank, width): a few ranks keep it quick
  o.cobra_b_max = 5;
  return run_allocate(o);
}

// The allocation's metrics of one layer from the definitions (verify.hpp) with plain loops in
// double: logits q.k * scale over the causal keys, V rows of the value dim.
Metrics brute_force(const CalibFile& c, const AllocFile& a, int layer, double scale) {
  const auto& p = c.prov;
  const int d = p.head_dim, dv = p.v_dim(), T = p.seq_len, M = c.holdout.windows, gs = p.n_heads / p.n_kv_heads;
  codec::RopeSpec rope;
  rope.enabled = true;
  rope.rotary_dim = p.rotary_dim;
  rope.pairing = p.pairing;
  rope.inv_freq = p.rope_inv_freq;
  rope.attention_factor = p.rope_attention_factor;
  double mae = 0, pairs = 0, kl = 0, queries = 0, eo = 0, no = 0, ek = 0, nk = 0, ev = 0, nv = 0;
  for (int h = 0; h < p.n_kv_heads; ++h) {
    const HeadDecision& kd = a.head(Side::kK, layer, h);
    const HeadDecision& vd = a.head(Side::kV, layer, h);
    codec::HeadCodec kc(kd, d), vc(vd, dv);
    for (int m = 0; m < M; ++m) {
      std::vector<float> k(size_t(T) * d), v(size_t(T) * dv), kh(k.size()), vh(v.size());
      for (int t = 0; t < T; ++t) {
        for (int i = 0; i < d; ++i)
          k[size_t(t) * d + i] = c.holdout.k[(((size_t(layer) * M + m) * T + t) * p.n_kv_heads + h) * d + i];
        for (int i = 0; i < dv; ++i)
          v[size_t(t) * dv + i] = c.holdout.v[(((size_t(layer) * M + m) * T + t) * p.n_kv_heads + h) * dv + i];
      }
      std::vector<float> kpost = k;
      for (int t = 0; t < T; ++t) codec::reference_apply_rope(kpost.data() + size_t(t) * d, d, t, rope);
      if (kd.post_rope) {
        kc.round_trip(kpost.data(), T, kh.data());
      } else {
        kc.round_trip(k.data(), T, kh.data());
        for (int t = 0; t < T; ++t) codec::reference_apply_rope(kh.data() + size_t(t) * d, d, t, rope);
      }
      vc.round_trip(v.data(), T, vh.data());
      for (size_t i = 0; i < k.size(); ++i) ek += std::pow(double(kpost[i]) - kh[i], 2), nk += std::pow(double(kpost[i]), 2);
      for (size_t i = 0; i < v.size(); ++i) ev += std::pow(double(v[i]) - vh[i], 2), nv += std::pow(double(v[i]), 2);
      for (int g = h * gs; g < (h + 1) * gs; ++g)
        for (int t = 0; t < T; ++t) {
          std::vector<float> q(static_cast<size_t>(d));
          for (int i = 0; i < d; ++i) q[size_t(i)] = c.holdout.q[(((size_t(layer) * M + m) * T + t) * p.n_heads + g) * d + i];
          codec::reference_apply_rope(q.data(), d, t, rope);
          const int n = t + 1;
          const size_t nn = static_cast<size_t>(n);
          std::vector<double> s(nn), sh(nn), pr(nn), ph(nn);
          for (int j = 0; j < n; ++j) {
            double a1 = 0, a2 = 0;
            for (int i = 0; i < d; ++i) {
              a1 += double(q[size_t(i)]) * kpost[size_t(j) * d + i];
              a2 += double(q[size_t(i)]) * kh[size_t(j) * d + i];
            }
            s[size_t(j)] = a1 * scale, sh[size_t(j)] = a2 * scale;
            mae += std::fabs(s[size_t(j)] - sh[size_t(j)]);
            pairs += 1;
          }
          auto softmax = [n](const std::vector<double>& in, std::vector<double>& out) {
            double mx = -1e300, z = 0;
            for (int j = 0; j < n; ++j) mx = std::max(mx, in[size_t(j)]);
            for (int j = 0; j < n; ++j) z += out[size_t(j)] = std::exp(in[size_t(j)] - mx);
            for (int j = 0; j < n; ++j) out[size_t(j)] /= z;
          };
          softmax(s, pr);
          softmax(sh, ph);
          for (int j = 0; j < n; ++j) kl += pr[size_t(j)] * (std::log(pr[size_t(j)]) - std::log(ph[size_t(j)]));
          queries += 1;
          for (int i = 0; i < dv; ++i) {  // the attention output in the value's 512 dims
            double o = 0, oh = 0;
            for (int j = 0; j < n; ++j) o += pr[size_t(j)] * v[size_t(j) * dv + i], oh += ph[size_t(j)] * vh[size_t(j) * dv + i];
            eo += (o - oh) * (o - oh);
            no += o * o;
          }
        }
    }
  }
  Metrics r;
  r.logit_mae = mae / pairs;
  r.kl = kl / queries;
  r.out_rel_err = eo / no;
  r.nmse_k = ek / nk;
  r.nmse_v = ev / nv;
  return r;
}

}  // namespace

TEST(KvDims, CalibrationFileRecordsBothDimsAndTheScale) {
  const Synth& s = mla();
  const CalibFile c = read_calib(mla_path(), true);
  EXPECT_EQ(c.format_version, 5);
  EXPECT_EQ(c.prov.head_dim, kD);
  EXPECT_EQ(c.prov.head_dim_v, kDv);
  EXPECT_EQ(c.prov.v_dim(), kDv);
  EXPECT_DOUBLE_EQ(c.prov.softmax_scale, kScale);
  EXPECT_NEAR(c.prov.attn_scale(), 0.11472, 5e-5);  // MODEL-FAMILIES.md's published figure
  EXPECT_EQ(c.shape().head_dim, kD);
  EXPECT_EQ(c.shape().v_dim(), kDv);
  EXPECT_EQ(c.moments.v.sum.size(), size_t(kL) * kH * kDv);
  EXPECT_EQ(c.moments.v.gram.size(), size_t(kL) * kH * kDv * kDv);
  EXPECT_EQ(c.moments.k.sum.size(), size_t(kL) * kH * kD);
  EXPECT_EQ(c.reservoir.v.size(), size_t(kCalWin) * kT * kL * kH * kDv);
  EXPECT_EQ(c.holdout.v.size(), size_t(kL) * kHoldWin * kT * kH * kDv);
  // V's sums and Gram diagonal from the rows fed in, in double; and V is K's latent part, so
  // the two sides' statistics agree there (an offset of 64 mixed up would not).
  for (int l = 0; l < kL; ++l) {
    std::vector<double> sum(kDv, 0.0), diag(kDv, 0.0), cross(kDv, 0.0);
    int64_t n = 0;
    for (const Rows& r : s.calib[l])
      for (int t = 0; t < kT; ++t, ++n)
        for (int i = 0; i < kDv; ++i) {
          const double x = r.v[size_t(t) * kDv + i];
          sum[size_t(i)] += x;
          diag[size_t(i)] += x * x;
          cross[size_t(i)] += x * r.v[size_t(t) * kDv + (i + 1) % kDv];
        }
    const SideMoments& v = c.moments.v;
    EXPECT_EQ(v.count_of(c.shape(), l, 0), n);
    const double* vs = v.sum_of(c.shape(), l, 0);
    const double* vg = v.gram_of(c.shape(), l, 0);
    const double* kg = c.moments.k.gram_of(c.shape(), l, 0);
    for (int i = 0; i < kDv; ++i) {
      EXPECT_NEAR(vs[i], sum[size_t(i)], 1e-9 * (1 + std::fabs(sum[size_t(i)])));
      EXPECT_NEAR(vg[size_t(i) * kDv + i], diag[size_t(i)], 1e-9 * diag[size_t(i)]);
      EXPECT_NEAR(vg[size_t(i) * kDv + (i + 1) % kDv], cross[size_t(i)], 1e-9 * (1 + std::fabs(cross[size_t(i)])));
      const int j = kD - kDv + i;
      EXPECT_NEAR(kg[size_t(j) * kD + j], diag[size_t(i)], 1e-9 * diag[size_t(i)]);
    }
  }
  // The reservoir's V rows come back as fed.
  EXPECT_EQ(c.reservoir.v[size_t(kDv) + 3], s.c.reservoir.v[size_t(kDv) + 3]);
}

TEST(KvDims, PreviousLayoutStillReads) {
  // Default dims and scale: written in the previous layout (version 3, no new keys, bytes as
  // before), read back with V at head_dim and scale 1/sqrt(head_dim).
  Synth s = make_synth(kD, 0.0, 3);
  const std::string path = dir() + "/plain.kvqcal.h5";
  write_calib(path, s.c);
  const CalibFile c = read_calib(path, true);
  EXPECT_EQ(c.format_version, 3);
  EXPECT_EQ(c.prov.head_dim_v, 0);
  EXPECT_EQ(c.prov.v_dim(), kD);
  EXPECT_DOUBLE_EQ(c.prov.attn_scale(), 1.0 / 24.0);
  EXPECT_EQ(c.shape().v_dim(), kD);
  EXPECT_EQ(c.moments.v.sum.size(), size_t(kL) * kH * kD);
  const std::string prov = provenance_to_json(c.prov);
  EXPECT_EQ(prov.find("head_dim_v"), std::string::npos);
  EXPECT_EQ(prov.find("softmax_scale"), std::string::npos);
  // A provenance with the new keys in a file claiming an older version is refused, one line.
  CalibProvenance p = mla().c.prov;
  const std::string text = provenance_to_json(p);
  EXPECT_NE(text.find("\"head_dim_v\": 512"), std::string::npos);
  EXPECT_EQ(provenance_from_json("f", text).head_dim_v, kDv);
  std::string bad = text;
  bad.replace(bad.find("\"head_dim_v\": 512"), 17, "\"head_dim_v\": 0");
  const std::string err = one_line_error([&] { provenance_from_json("f.kvqcal.h5", bad); });
  EXPECT_NE(err.find("provenance.head_dim_v"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos);
}

TEST(KvDims, EveryMethodAllocatesKAndVAtTheirOwnDims) {
  const struct {
    Method k, v;
  } pairs[] = {{Method::kUniform, Method::kUniform},          {Method::kBlockGtq, Method::kUniform},
               {Method::kCobraMse, Method::kCobraMse},        {Method::kCobraKl, Method::kCobraDp},
               {Method::kCobraDp, Method::kUniform},              {Method::kCobraMeasured, Method::kCobraMeasured},
               {Method::kLayerPrecision, Method::kLayerPrecision}};
  for (const auto& pr : pairs) {
    const std::string name = std::string(to_string(pr.k)) + "_" + to_string(pr.v);
    SCOPED_TRACE(name);
    const std::string out = dir() + "/" + name + ".kvqalloc.h5";
    const double bpd = pr.k == Method::kLayerPrecision ? 6 : 3;
    allocate(pr.k, pr.v, out, bpd);
    const AllocFile a = read_alloc(out);
    EXPECT_EQ(alloc_version_for(a), 6);
    EXPECT_EQ(a.calib.head_dim, kD);
    EXPECT_EQ(a.calib.v_dim(), kDv);
    EXPECT_DOUBLE_EQ(a.calib.softmax_scale, kScale);
    ASSERT_EQ(a.heads.size(), size_t(2 * kL * kH));
    for (const HeadDecision& h : a.heads) {
      const int d = h.side == Side::kK ? kD : kDv;
      EXPECT_NO_THROW(codec::HeadCodec(h, d));  // the codec validates the decision at the side's dim
      if (h.kind == CodingKind::kTqGroups || h.kind == CodingKind::kLowRankHadamard) {  // they carry dims
        EXPECT_ANY_THROW(codec::HeadCodec(h, h.side == Side::kK ? kDv : kD)) << "side " << int(h.side);
      }
      if (h.kind == CodingKind::kTqGroups) {
        std::set<int> dims;
        for (const auto& g : h.groups) dims.insert(g.dims.begin(), g.dims.end());
        EXPECT_EQ(dims.size(), size_t(d));
        EXPECT_EQ(*dims.rbegin(), d - 1);
      }
      if (h.kind == CodingKind::kLowRankHadamard) {
        EXPECT_EQ(h.basis.size(), size_t(d) * size_t(h.rank));
        EXPECT_LE(h.rank, d);
      }
    }
    EXPECT_TRUE(std::isfinite(a.k_bpd_effective));
    EXPECT_TRUE(std::isfinite(a.v_bpd_effective));
    if (pr.k == Method::kBlockGtq) {
      // The 32 rotary blocks (adjacent pairs) each lie in one group; the static latent too.
      for (int l = 0; l < kL; ++l) {
        const HeadDecision& k = a.head(Side::kK, l, 0);
        std::vector<int> group_of(kD, -1);
        for (size_t gi = 0; gi < k.groups.size(); ++gi)
          for (int x : k.groups[gi].dims) group_of[size_t(x)] = int(gi);
        for (int b = 0; b < kRot / 2; ++b) EXPECT_EQ(group_of[size_t(2 * b)], group_of[size_t(2 * b + 1)]) << b;
      }
    }
  }
}

TEST(KvDims, VerifyUsesTheRecordedScaleAndTheValueDim) {
  const std::string out = dir() + "/verify.kvqalloc.h5";
  for (Method k : {Method::kUniform, Method::kBlockGtq}) {
    SCOPED_TRACE(to_string(k));
    allocate(k, Method::kUniform, out, 3);
    VerifyOptions o;
    o.calib = mla_path();
    o.alloc = out;
    o.cuda = false;
    const VerifyReport r = run_verify(o);
    const CalibFile c = read_calib(mla_path(), true);
    const AllocFile a = read_alloc(out);
    ASSERT_EQ(r.alloc.layers.size(), size_t(kL));
    for (int l = 0; l < kL; ++l) {
      const Metrics want = brute_force(c, a, l, kScale);
      const Metrics& got = r.alloc.layers[size_t(l)];
      EXPECT_NEAR(got.logit_mae, want.logit_mae, 1e-5 * want.logit_mae) << l;
      EXPECT_NEAR(got.kl, want.kl, 1e-3 * want.kl) << l;
      EXPECT_NEAR(got.out_rel_err, want.out_rel_err, 1e-3 * want.out_rel_err) << l;
      EXPECT_NEAR(got.nmse_k, want.nmse_k, 1e-6 * want.nmse_k) << l;
      EXPECT_NEAR(got.nmse_v, want.nmse_v, 1e-6 * want.nmse_v) << l;
      // Negative control: 1/sqrt(576) is a different figure, well outside the tolerance.
      const Metrics wrong = brute_force(c, a, l, 1.0 / std::sqrt(double(kD)));
      // (logits scale linearly: the wrong scale gives (1/24) / kScale of the figure).
      EXPECT_GT(std::fabs(got.logit_mae - wrong.logit_mae), 0.5 * got.logit_mae * std::fabs(1.0 - 1.0 / (24.0 * kScale)))
          << l;
    }
  }
}

TEST(KvDims, DisagreeingDimsAreRefusedInOneLine) {
  const std::string out = dir() + "/mismatch.kvqalloc.h5";
  allocate(Method::kUniform, Method::kUniform, out, 2);
  // The same statistics with V at 576 (the naive layout) and with the default scale.
  Synth v576 = make_synth(kD, kScale);
  const std::string p576 = dir() + "/v576.kvqcal.h5";
  write_calib(p576, v576.c);
  Synth plain_scale = make_synth(kDv, 0.0);
  const std::string pscale = dir() + "/scale.kvqcal.h5";
  write_calib(pscale, plain_scale.c);
  const AllocFile a = read_alloc(out);
  struct {
    std::string calib, field, value;
  } cases[] = {{p576, "calibration.head_dim_v", "'512'"}, {pscale, "calibration.softmax_scale", "0.1147"}};
  for (const auto& cs : cases) {
    const CalibFile c = read_calib(cs.calib, false);
    std::string err = one_line_error([&] { check_alloc_matches(a, out, c, cs.calib); });
    EXPECT_NE(err.find(out), std::string::npos) << err;
    EXPECT_NE(err.find(cs.field), std::string::npos) << err;
    EXPECT_NE(err.find(cs.value), std::string::npos) << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
    VerifyOptions o;
    o.calib = cs.calib;
    o.alloc = out;
    o.cuda = false;
    err = one_line_error([&] { run_verify(o); });
    EXPECT_NE(err.find(cs.field), std::string::npos) << err;
  }
  // One budget over K and V needs one dim: refused before anything is written.
  AllocateOptions o;
  o.calib = mla_path();
  o.out = dir() + "/joint.kvqalloc.h5";
  o.method = Method::kCobraDp;
  o.v_method = Method::kCobraDp;
  o.joint_kv = true;
  const std::string err = one_line_error([&] { run_allocate(o); });
  EXPECT_NE(err.find("provenance.head_dim_v"), std::string::npos) << err;
  EXPECT_NE(err.find("512"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(o.out));
}
