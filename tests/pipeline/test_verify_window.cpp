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
#include "verify_brute.hpp"

namespace fs = std::filesystem;
using namespace kvq;
using kvq::test::bin;
using kvq::test::run_cmd;
using kvq::test::temp_path;
using kvq::test::expect_same;
using kvq::test::verify_cpu;

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

// The allocation's figures for one layer by brute force (verify_brute.hpp) over keys lo(t)..t,
// lo(t) = t - window + 1 (0: every earlier key).
Metrics brute_force(const CalibFile& c, const AllocFile& a, int layer, int window) {
  test::BruteOptions o;
  o.window = window;
  o.scale = 1.0 / std::sqrt(double(c.prov.head_dim));
  o.rotate = test::provenance_rotate(c.prov);
  return test::verify_brute_force(c, a, layer, o);
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
  const VerifyReport rep = verify_cpu(f.cal, f.alloc);
  ASSERT_EQ(rep.alloc.layers.size(), 2u);

  // The same file without its windows: an older file, read as full attention.
  CalibFile full = c;
  full.prov.layer_window.clear();
  const std::string full_path = temp_path("verify_swa_full.kvqcal.h5");
  write_calib(full_path, full);
  const VerifyReport rep_full = verify_cpu(full_path, f.alloc);

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
