// kvq-verify on a sliding-window model: the held-out attention metrics count only the keys the model
// attends (t - W < j <= t), checked against a brute-force computation written here, and they differ
// from full causal attention (negative control). Also: calib-capture records the windows, a file
// without them reads as full attention, and merging files of different windows is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "kvq/capture/capture.hpp"
#include "kvq/codec/attention.hpp"
#include "kvq/codec/codec.hpp"
#include "kvq/io/alloc_file.hpp"
#include "kvq/io/calib_file.hpp"
#include "kvq/pipeline/verify.hpp"
#include "kvq/util/error.hpp"
#include "run_cmd.hpp"

namespace fs = std::filesystem;
using namespace kvq;
using kvq::test::bin;
using kvq::test::run_cmd;
using kvq::test::temp_path;

namespace {

constexpr int kWindow = 32;  // kvq-make-tiny-hf --family mistral-swa
constexpr int kSeqLen = 96;  // > kWindow, so most queries lose keys to the window

struct Files {
  std::string cal, alloc;
};

Files make_files() {
  const std::string dir = temp_path("verify_swa");
  Files f{dir + "/c.kvqcal.h5", dir + "/a.kvqalloc.h5"};
  if (fs::exists(f.alloc)) return f;
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto r = run_cmd(std::string(KVQ_MAKE_TINY_HF) + " --family mistral-swa --seed 1 --out " + dir + "/m");
  EXPECT_EQ(r.status, 0) << r.err;
  {
    std::mt19937 rng(1);
    const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "from"};
    std::ofstream c(dir + "/c.txt");
    for (int i = 0; i < 6000; ++i) c << words[rng() % 12] << (i % 17 == 16 ? ".\n" : " ");
  }
  r = run_cmd(bin("calib-capture") + " -q --threads 1 --model " + dir + "/m --corpus " + dir + "/c.txt" +
              " --samples 4 --seq-len " + std::to_string(kSeqLen) + " --holdout 2 --reservoir-tokens 64 --out " + f.cal);
  EXPECT_EQ(r.status, 0) << r.err;
  r = run_cmd(bin("kvq-allocate") + " -q --calib " + f.cal + " --method uniform --bpd 2 --out " + f.alloc);
  EXPECT_EQ(r.status, 0) << r.err;
  return f;
}

// The allocation's figures for one layer, from the definitions in verify.hpp with plain loops:
// decoded keys/values from the CPU codec, logits and softmax in double over keys lo(t)..t.
Metrics brute_force(const CalibFile& c, const AllocFile& a, int layer, int window) {
  const auto& p = c.prov;
  const int H = p.n_kv_heads, NH = p.n_heads, d = p.head_dim, T = p.seq_len, M = c.holdout.windows;
  const int gs = NH / H;
  codec::RopeSpec rope;
  rope.enabled = true;
  rope.theta = p.rope_theta;
  rope.rotary_dim = p.rotary_dim;
  rope.pairing = p.pairing;
  rope.inv_freq = p.rope_inv_freq;
  rope.attention_factor = p.rope_attention_factor;
  double mae = 0, pairs = 0, kl = 0, top = 0, queries = 0, eo = 0, no = 0;
  for (int h = 0; h < H; ++h) {
    const HeadDecision *kd = nullptr, *vd = nullptr;
    for (const auto& x : a.heads)
      if (x.layer == layer && x.kv_head == h) (x.side == Side::kK ? kd : vd) = &x;
    EXPECT_TRUE(kd && vd);
    codec::HeadCodec kc(*kd, d), vc(*vd, d);
    for (int m = 0; m < M; ++m) {
      auto kv_at = [&](const kvq::payload::FloatVector& src, int t, int i) {
        return src[(((size_t(layer) * M + m) * T + t) * H + h) * d + i];
      };
      std::vector<float> k(size_t(T) * d), v(k.size()), kh(k.size()), vh(k.size());
      for (int t = 0; t < T; ++t)
        for (int i = 0; i < d; ++i) k[size_t(t) * d + i] = kv_at(c.holdout.k, t, i), v[size_t(t) * d + i] = kv_at(c.holdout.v, t, i);
      std::vector<float> kpost = k;
      for (int t = 0; t < T; ++t) codec::reference_apply_rope(kpost.data() + size_t(t) * d, d, c.holdout.positions[t], rope);
      if (kd->post_rope) {
        kc.round_trip(kpost.data(), T, kh.data());
      } else {
        kc.round_trip(k.data(), T, kh.data());
        for (int t = 0; t < T; ++t) codec::reference_apply_rope(kh.data() + size_t(t) * d, d, c.holdout.positions[t], rope);
      }
      vc.round_trip(v.data(), T, vh.data());
      for (int g = h * gs; g < (h + 1) * gs; ++g) {
        for (int t = 0; t < T; ++t) {
          std::vector<float> q(static_cast<size_t>(d));
          for (int i = 0; i < d; ++i) q[size_t(i)] = c.holdout.q[(((size_t(layer) * M + m) * T + t) * NH + g) * d + i];
          codec::reference_apply_rope(q.data(), d, c.holdout.positions[t], rope);
          std::vector<int> keys;
          for (int j = 0; j <= t; ++j)
            if (window == 0 || j > t - window) keys.push_back(j);
          const int n = int(keys.size());
          std::vector<double> s(n), sh(n), pr(n), ph(n);
          for (int x = 0; x < n; ++x) {
            double a1 = 0, a2 = 0;
            for (int i = 0; i < d; ++i) {
              a1 += double(q[size_t(i)]) * kpost[size_t(keys[x]) * d + i];
              a2 += double(q[size_t(i)]) * kh[size_t(keys[x]) * d + i];
            }
            s[x] = a1 / std::sqrt(double(d)), sh[x] = a2 / std::sqrt(double(d));
            mae += std::fabs(s[x] - sh[x]);
            pairs += 1;
          }
          auto softmax = [n](const std::vector<double>& in, std::vector<double>& out) {
            double mx = -1e300, z = 0;
            for (int x = 0; x < n; ++x) mx = std::max(mx, in[x]);
            for (int x = 0; x < n; ++x) z += out[x] = std::exp(in[x] - mx);
            for (int x = 0; x < n; ++x) out[x] /= z;
          };
          softmax(s, pr);
          softmax(sh, ph);
          for (int x = 0; x < n; ++x) kl += pr[x] * (std::log(pr[x]) - std::log(ph[x]));
          // top-10 by rank counting: key x is in the top k when fewer than k keys beat it
          // (ties to the lower key index).
          const int kk = std::min(10, n);
          auto in_top = [&](const std::vector<double>& w, int x) {
            int better = 0;
            for (int y = 0; y < n; ++y) better += w[y] > w[x] || (w[y] == w[x] && y < x);
            return better < kk;
          };
          int common = 0;
          for (int x = 0; x < n; ++x) common += in_top(pr, x) && in_top(ph, x);
          top += double(common) / kk;
          queries += 1;
          for (int i = 0; i < d; ++i) {
            double o = 0, oh = 0;
            for (int x = 0; x < n; ++x) {
              o += pr[x] * v[size_t(keys[x]) * d + i];
              oh += ph[x] * vh[size_t(keys[x]) * d + i];
            }
            eo += (o - oh) * (o - oh);
            no += o * o;
          }
        }
      }
    }
  }
  Metrics r;
  r.logit_mae = mae / pairs;
  r.kl = kl / queries;
  r.top10 = top / queries;
  r.out_rel_err = eo / no;
  return r;
}

VerifyReport verify(const std::string& cal, const std::string& alloc) {
  VerifyOptions o;
  o.calib = cal;
  o.alloc = alloc;
  o.cuda = false;
  return run_verify(o);
}

// verify multiplies float Q by float K before widening, the brute force sums in double.
void expect_same(const Metrics& got, const Metrics& want, const std::string& what) {
  EXPECT_NEAR(got.logit_mae, want.logit_mae, 1e-5 * want.logit_mae) << what;
  EXPECT_NEAR(got.kl, want.kl, 1e-3 * want.kl) << what;
  EXPECT_NEAR(got.top10, want.top10, 1e-9) << what;
  EXPECT_NEAR(got.out_rel_err, want.out_rel_err, 1e-3 * want.out_rel_err) << what;
}

}  // namespace

TEST(VerifyWindow, CaptureRecordsTheWindows) {
  const Files f = make_files();
  const CalibFile c = read_calib(f.cal, false);
  EXPECT_EQ(c.prov.layer_window, (std::vector<int>{kWindow, kWindow}));
  const std::string txt = temp_path("verify_swa_inspect.txt");
  const auto r = run_cmd(bin("kvq-inspect") + " " + f.cal + " > " + txt);
  ASSERT_EQ(r.status, 0) << r.err;
  std::ifstream in(txt);
  const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(out.find("(0 = full): 32 32"), std::string::npos) << out;
}

TEST(VerifyWindow, MetricsCountOnlyTheAttendedKeys) {
  const Files f = make_files();
  const CalibFile c = read_calib(f.cal, true);
  const AllocFile a = read_alloc(f.alloc);
  ASSERT_GT(c.prov.seq_len, 2 * kWindow);
  const VerifyReport rep = verify(f.cal, f.alloc);
  ASSERT_EQ(rep.alloc.layers.size(), 2u);

  // The same file without its windows: an older file, read as full attention.
  CalibFile full = c;
  full.prov.layer_window.clear();
  const std::string full_path = temp_path("verify_swa_full.kvqcal.h5");
  write_calib(full_path, full);
  const VerifyReport rep_full = verify(full_path, f.alloc);

  for (int l = 0; l < 2; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const Metrics win = brute_force(c, a, l, kWindow), causal = brute_force(c, a, l, 0);
    const Metrics& got = rep.alloc.layers[size_t(l)];
    expect_same(got, win, "windowed");
    expect_same(rep_full.alloc.layers[size_t(l)], causal, "full causal");
    std::printf("layer %d windowed / full causal: logit MAE %.6g / %.6g, KL %.6g / %.6g, top-10 %.6g / %.6g, "
                "output error %.6g / %.6g\n", l, got.logit_mae, causal.logit_mae, got.kl, causal.kl, got.top10,
                causal.top10, got.out_rel_err, causal.out_rel_err);
    // Negative control: the full-causal figures differ from the windowed ones by at least ten times
    // the tolerance of expect_same.
    EXPECT_GT(std::fabs(got.kl - causal.kl), 1e-2 * causal.kl);
    EXPECT_GT(std::fabs(got.out_rel_err - causal.out_rel_err), 1e-2 * causal.out_rel_err);
    EXPECT_GT(std::fabs(got.logit_mae - causal.logit_mae), 1e-4 * causal.logit_mae);
    EXPECT_GT(std::fabs(got.top10 - causal.top10), 1e-3);
    // NMSE is over every stored token, window or not.
    EXPECT_DOUBLE_EQ(got.nmse_k, rep_full.alloc.layers[size_t(l)].nmse_k);
  }
}

TEST(VerifyWindow, MergeRefusesDifferentWindows) {
  const Files f = make_files();
  const CalibFile a = read_calib(f.cal, true);
  CalibFile b = a;
  b.prov.layer_window = {kWindow, 0};
  try {
    merge_calib(a, "a.kvqcal.h5", b, "b.kvqcal.h5");
    FAIL() << "merged files of different windows";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("provenance.layer_window"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("layer 1 window 0"), std::string::npos) << e.what();
  }
  // An older file (no windows recorded) and an explicit all-full one are the same attention.
  CalibFile x = a, y = a;
  x.prov.layer_window.clear();
  y.prov.layer_window = {0, 0};
  try {
    merge_calib(x, "x", y, "y");
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("layer_window"), std::string::npos) << e.what();
  }
}
