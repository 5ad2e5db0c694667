// layer-precision end to end on the demo model: kvq-allocate picks FP8 / NVFP4 per layer under the
// budget, the allocation file carries the minifloat decisions (version 2) and kvq-verify codes them
// with the CPU reference codec: FP8 (8 bits) must beat NVFP4 (4.5 bits) on logit error, and the
// mixed allocation lands between. Bad flags, budgets and fields are one-line errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "kvq/io/alloc_file.hpp"
#include "kvq/util/error.hpp"
#include "run_cmd.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;
using kvq::test::bin;
using kvq::test::run_cmd;
using kvq::test::temp_path;

namespace {

std::string demo_cal() {
  auto text = temp_path("lp_genesis.txt");
  if (!fs::exists(text) && run_cmd("bible -p /usr/lib gen1:1-gen50:26 > " + text).status != 0) return "";
  auto out = temp_path("lp_demo.kvqcal.h5");
  if (fs::exists(out)) return out;
  auto r = run_cmd(bin("calib-capture") + " -q --threads 1 --model " + std::string(KVQ_SOURCE_DIR) +
                   "/data/kvq-demo-llama --corpus " + text +
                   " --samples 16 --seq-len 128 --holdout 2 --reservoir-tokens 256 --out " + out);
  EXPECT_EQ(r.status, 0) << r.err;
  return out;
}

std::string allocate(const std::string& cal, const std::string& bpd, const std::string& extra = "") {
  auto out = temp_path("lp_" + bpd + ".kvqalloc.h5");
  auto r = run_cmd(bin("kvq-allocate") + " -q --calib " + cal +
                   " --method layer-precision --v-method layer-precision --bpd " + bpd + " " + extra + " --out " + out);
  EXPECT_EQ(r.status, 0) << r.err;
  return out;
}

json verify(const std::string& cal, const std::string& alloc) {
  auto out = temp_path("lp_verify.json");
  fs::remove(out);
  // The uniform baseline needs whole bits: 4 for K and V.
  auto r = run_cmd(bin("kvq-verify") + " -q --calib " + cal + " --alloc " + alloc +
                   " --baseline-k-bpd 4 --baseline-v-bpd 4 --json " + out);
  EXPECT_EQ(r.status, 0) << r.err;
  if (!fs::exists(out)) return json();
  return json::parse(std::ifstream(out));
}

int count_format(const kvq::AllocFile& a, kvq::MinifloatFormat f) {
  int n = 0;
  for (const auto& h : a.heads) n += h.kind == kvq::CodingKind::kMinifloat && h.minifloat == f;
  return n;
}

TEST(LayerPrecisionCli, VerifyRanksFp8AboveMixedAboveNvfp4) {
  const std::string cal = demo_cal();
  if (cal.empty()) GTEST_SKIP() << "needs `bible` (Debian bible-kjv)";
  const auto fp8 = kvq::read_alloc(allocate(cal, "8"));
  const auto nv = kvq::read_alloc(allocate(cal, "4.5"));
  const std::string mixed_path = allocate(cal, "6");
  const auto mixed = kvq::read_alloc(mixed_path);
  const int n = int(fp8.heads.size());
  EXPECT_EQ(count_format(fp8, kvq::MinifloatFormat::kFp8E4M3), n);
  EXPECT_EQ(count_format(nv, kvq::MinifloatFormat::kNvfp4), n);
  const int mixed_fp8 = count_format(mixed, kvq::MinifloatFormat::kFp8E4M3);
  EXPECT_GT(mixed_fp8, 0);
  EXPECT_LT(mixed_fp8, n);
  EXPECT_DOUBLE_EQ(fp8.k_bpd_effective, 8.0);
  EXPECT_DOUBLE_EQ(nv.v_bpd_effective, 4.5);
  EXPECT_LE((mixed.k_bpd_effective + mixed.v_bpd_effective) / 2, 6.0);
  for (const auto& h : mixed.heads) {
    EXPECT_TRUE(std::isfinite(h.scale) && h.scale > 0);
    EXPECT_EQ(h.post_rope, h.side == kvq::Side::kK);
  }
  // The file is version 2 and its manifest names the kind and format.
  auto r = run_cmd(bin("kvq-inspect") + " " + mixed_path);
  EXPECT_EQ(r.status, 0) << r.err;

  const json jf = verify(cal, temp_path("lp_8.kvqalloc.h5"));
  const json jn = verify(cal, temp_path("lp_4.5.kvqalloc.h5"));
  const json jm = verify(cal, mixed_path);
  const double mf = jf["allocation"]["overall"]["logit_mae"], mn = jn["allocation"]["overall"]["logit_mae"],
               mm = jm["allocation"]["overall"]["logit_mae"];
  std::printf("demo (16 windows): logit MAE all-fp8 %.5f, mixed @6 %.5f, all-nvfp4 %.5f\n", mf, mm, mn);
  EXPECT_LT(mf, mn);
  EXPECT_LT(mm, mn);
  EXPECT_GT(mm, mf);
  // FP8's relative error is far below NVFP4's on both sides.
  EXPECT_LT(double(jf["allocation"]["overall"]["nmse_k"]) * 4, double(jn["allocation"]["overall"]["nmse_k"]));
  EXPECT_LT(double(jf["allocation"]["overall"]["nmse_v"]) * 4, double(jn["allocation"]["overall"]["nmse_v"]));
}

void expect_allocate_error(const std::string& cal, const std::string& args, const std::string& needle) {
  auto out = temp_path("lp_bad.kvqalloc.h5");
  fs::remove(out);
  auto r = run_cmd(bin("kvq-allocate") + " -q --calib " + cal + " --out " + out + " " + args);
  EXPECT_EQ(r.status, 2) << args << ": " << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.err;
  EXPECT_FALSE(fs::exists(out)) << args;
}

TEST(LayerPrecisionCli, BadBudgetsAndFlags) {
  const std::string cal = demo_cal();
  if (cal.empty()) GTEST_SKIP() << "needs `bible` (Debian bible-kjv)";
  const std::string lp = "--method layer-precision --v-method layer-precision ";
  expect_allocate_error(cal, lp + "--bpd 4.4", "--bpd: 4.4 is below the cheapest layer-precision choice: all nvfp4 = 4.5");
  expect_allocate_error(cal, lp + "--bpd 7 --formats fp8", "all fp8 = 8");
  expect_allocate_error(cal, lp + "--bpd 6 --formats fp8,fp9", "--formats: unknown format 'fp9'");
  expect_allocate_error(cal, lp + "--bpd 6 --formats nvfp4,nvfp4", "given twice");
  // --v-method follows --method layer-precision unless given; given as something else it is refused.
  expect_allocate_error(cal, "--method layer-precision --v-method uniform --bpd 6",
                        "--v-method: layer-precision chooses one format per layer");
  {
    auto out = temp_path("lp_default_v.kvqalloc.h5");
    auto r = run_cmd(bin("kvq-allocate") + " -q --calib " + cal + " --method layer-precision --bpd 6 --out " + out);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(kvq::read_alloc(out).v_method, "layer-precision");
  }
  // A calibration file from before the amax statistics (format version 2).
  expect_allocate_error(std::string(KVQ_SOURCE_DIR) + "/data/golden/calib-v2.kvqcal.h5", lp + "--bpd 6",
                        "/stats/amax_k: missing: layer-precision needs the activation maxima");
}

void expect_read_error(const kvq::AllocFile& a, const std::string& needle) {
  const auto path = temp_path("lp_field.kvqalloc.h5");
  kvq::write_alloc(path, a);
  try {
    kvq::read_alloc(path);
    ADD_FAILURE() << "read; wanted '" << needle << "'";
  } catch (const kvq::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(needle), std::string::npos) << m;
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

TEST(LayerPrecisionCli, AllocationFileRoundTripAndBadFields) {
  const std::string cal = demo_cal();
  if (cal.empty()) GTEST_SKIP() << "needs `bible` (Debian bible-kjv)";
  const auto a = kvq::read_alloc(allocate(cal, "6"));
  // Written back and read again: same decisions bit for bit.
  const auto path = temp_path("lp_rt.kvqalloc.h5");
  kvq::write_alloc(path, a);
  const auto b = kvq::read_alloc(path);
  ASSERT_EQ(a.heads.size(), b.heads.size());
  for (size_t i = 0; i < a.heads.size(); ++i) {
    EXPECT_EQ(a.heads[i].minifloat, b.heads[i].minifloat);
    EXPECT_EQ(a.heads[i].scale, b.heads[i].scale);
    EXPECT_EQ(a.heads[i].kind, kvq::CodingKind::kMinifloat);
  }
  EXPECT_EQ(kvq::alloc_version_for(a), 2);
  EXPECT_EQ(kvq::alloc_manifest(a)["version"], 2);
  // A file without minifloat heads stays version 1 (what older kvq reads).
  auto old = a;
  for (auto& h : old.heads) {
    h.kind = kvq::CodingKind::kKivi;
    h.bits = 4;
    h.group_size = 32;
  }
  EXPECT_EQ(kvq::alloc_version_for(old), 1);

  auto bad = a;
  bad.heads[3].scale = std::numeric_limits<float>::quiet_NaN();
  expect_read_error(bad, "manifest.heads[3].scale: must be a finite number > 0, found null");
  bad = a;
  bad.heads[0].scale = -2.f;
  expect_read_error(bad, "manifest.heads[0].scale: must be finite and > 0, found -2");
  bad = a;
  bad.heads[1].minifloat = static_cast<kvq::MinifloatFormat>(9);
  expect_read_error(bad, "manifest.heads[1].format: unknown minifloat format 'unknown'");
}

}  // namespace
