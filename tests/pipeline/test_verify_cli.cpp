// kvq-verify on real held-out activations: the metrics against known constants, the paper's
// comparison reported, the CI gate failing and passing, and mismatched inputs refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kvq/io/alloc_file.hpp"
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

json verify(const std::string& cal, const std::string& alloc_args, const std::string& verify_args, int* status,
            std::string* err = nullptr) {
  auto alloc = temp_path("v.kvqalloc.h5"), out = temp_path("v.json");
  fs::remove(out);
  auto r = run_cmd(bin("kvq-allocate") + " -q --calib " + cal + " --out " + alloc + " " + alloc_args);
  EXPECT_EQ(r.status, 0) << r.err;
  r = run_cmd(bin("kvq-verify") + " -q --calib " + cal + " --alloc " + alloc + " --json " + out + " " + verify_args);
  *status = r.status;
  if (err) *err = r.err;
  if (!fs::exists(out)) return json();
  return json::parse(std::ifstream(out));
}

void report_paper_comparison(const std::string& cal, const std::string& name) {
  for (const char* bpd : {"2", "3"}) {
    int st;
    json j = verify(cal, std::string("--method block-gtq --bpd ") + bpd, "", &st);
    ASSERT_EQ(st, 0);
    const auto& a = j["allocation"];
    const auto& b = j["baseline"];
    std::printf("%s K%s block-gtq vs uniform TQ-MSE: layer wins %d/%d\n", name.c_str(), bpd, int(j["layer_wins"]),
                int(j["n_layers"]));
    for (size_t l = 0; l < a["layers"].size(); ++l)
      std::printf("  layer %zu logit MAE %.5f vs %.5f (%.1f%% lower)\n", l, double(a["layers"][l]["logit_mae"]),
                  double(b["layers"][l]["logit_mae"]),
                  100 * (1 - double(a["layers"][l]["logit_mae"]) / double(b["layers"][l]["logit_mae"])));
    std::printf("  overall: MAE %.5f vs %.5f, KL %.4g vs %.4g, top-10 %.3f vs %.3f, K bpd effective %.3f vs %.3f\n",
                double(a["overall"]["logit_mae"]), double(b["overall"]["logit_mae"]), double(a["overall"]["kl"]),
                double(b["overall"]["kl"]), double(a["overall"]["top10"]), double(b["overall"]["top10"]),
                double(a["k_bpd_effective"]), double(b["k_bpd_effective"]));
    EXPECT_EQ(a["layers"].size(), j["n_layers"]);
  }
}

}  // namespace

TEST(VerifyCli, UniformNmseFollowsTheLloydMaxTable) {
  std::string cal = demo_cal("verify");
  if (cal.empty()) GTEST_SKIP() << "needs `bible` (Debian bible-kjv)";
  // Haar-rotated unit vectors in d = 64 are near N(0, 1/64) per coordinate, so the relative error of
  // TQ-MSE is the Lloyd-Max MSE of N(0,1) (REFERENCE-FACTS), within a few percent.
  const double table[] = {0, 0.3634, 0.1175, 0.03455, 0.009501};
  double prev_mae = 1e9;
  for (int b = 1; b <= 4; ++b) {
    int st;
    json j = verify(cal, "--method uniform --bpd " + std::to_string(b), "", &st);
    ASSERT_EQ(st, 0);
    double nk = j["allocation"]["overall"]["nmse_k"], nv = j["allocation"]["overall"]["nmse_v"];
    EXPECT_NEAR(nk / table[b], 1.0, 0.12) << "b=" << b << " NMSE-K " << nk;
    EXPECT_NEAR(nv / table[b], 1.0, 0.12) << "b=" << b << " NMSE-V " << nv;
    double mae = j["allocation"]["overall"]["logit_mae"];
    EXPECT_LT(mae, prev_mae) << "logit MAE must fall with bits";
    prev_mae = mae;
    // The allocation and the in-process uniform baseline are the same quantizer: identical figures.
    EXPECT_DOUBLE_EQ(double(j["baseline"]["overall"]["logit_mae"]), mae);
  }
  int st;
  json j = verify(cal, "--method uniform --bpd 8", "", &st);
  EXPECT_LT(double(j["allocation"]["overall"]["kl"]), 1e-4);
  EXPECT_GT(double(j["allocation"]["overall"]["top10"]), 0.98);
}

TEST(VerifyCli, PaperComparisonDemo) {
  std::string cal = demo_cal("verify");
  if (cal.empty()) GTEST_SKIP() << "needs `bible` (Debian bible-kjv)";
  report_paper_comparison(cal, "kvq-demo-llama");
}

TEST(VerifyCli, PaperComparisonStories) {
  KVQ_REQUIRE_SHARED("models/stories260K/stories260K.bin");
  report_paper_comparison(stories_cal("verify"), "stories260K");
}

TEST(VerifyCli, GateFailsOnABadAllocationAndPassesAGoodOne) {
  std::string cal = demo_cal("verify");
  if (cal.empty()) GTEST_SKIP() << "needs `bible` (Debian bible-kjv)";
  int st;
  std::string err;
  json j = verify(cal, "--method uniform --bpd 1 --v-bpd 1", "--max-logit-mae 0.2 --min-top10 0.9", &st, &err);
  EXPECT_EQ(st, 1) << err;
  EXPECT_NE(err.find("gate failed: --max-logit-mae 0.2"), std::string::npos) << err;
  EXPECT_NE(err.find("--min-top10"), std::string::npos) << err;
  EXPECT_FALSE(bool(j["passed"]));
  j = verify(cal, "--method block-gtq --bpd 4", "--max-logit-mae 0.2 --min-top10 0.9 --min-layer-wins 1", &st, &err);
  EXPECT_EQ(st, 0) << err;
  EXPECT_TRUE(bool(j["passed"]));
}

TEST(VerifyCli, RefusesAnAllocationOfAnotherModel) {
  KVQ_REQUIRE_SHARED("models/stories260K/stories260K.bin");
  std::string cal = demo_cal("verify");
  if (cal.empty()) GTEST_SKIP() << "needs `bible` (Debian bible-kjv)";
  auto alloc = temp_path("stories.kvqalloc.h5");
  ASSERT_EQ(run_cmd(bin("kvq-allocate") + " -q --calib " + stories_cal("verify") + " --method uniform --bpd 2 --out " + alloc).status, 0);
  auto out = temp_path("never.json");
  fs::remove(out);
  auto r = run_cmd(bin("kvq-verify") + " -q --calib " + cal + " --alloc " + alloc + " --json " + out);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("model_config_sha256"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(fs::exists(out));
}

// The GPU path (issue 24): without a GPU the report says so (text and JSON) and nothing is counted;
// with one, every (layer, KV head, side) of a Block-GTQ allocation (post-RoPE K, compact group
// norms), a KV-COBRA one (low rank) and a layer-precision one (FP8 / NVFP4) went through the GPU
// encoder with codes equal to the CPU's and was decoded within the stated tolerance, and every
// layer ran as a GPU-resident cache (appended step by step, bytes equal to the CPU encoder's)
// under the fused attention at several steps per window, within its tolerance.
TEST(VerifyCli, GpuPathReported) {
  std::string cal = demo_cal("verify");
  if (cal.empty()) GTEST_SKIP() << "needs `bible` (Debian bible-kjv)";
  for (const std::string args :
       {"--method block-gtq --bpd 3 --group-norms compact", "--method cobra-mse --bpd 3", "--method layer-precision --bpd 6"}) {
    int st;
    std::string err;
    json j = verify(cal, args, "", &st, &err);
    ASSERT_EQ(st, 0) << args << ": " << err;
    const json& g = j["gpu"];
    const auto a = kvq::read_alloc(temp_path("v.kvqalloc.h5"));
    const bool gpu = g["ran"].get<bool>();
    if (!gpu) {
      EXPECT_NE(j["cuda"].get<std::string>().find("no GPU"), std::string::npos) << j["cuda"];
      EXPECT_EQ(g["tokens"], 0);
      EXPECT_EQ(g["attention_problems"], 0);
      EXPECT_EQ(g["cache_layers"], 0);
      EXPECT_EQ(g["cache_steps"], 0);
      EXPECT_TRUE(g["notes"].empty());
      EXPECT_TRUE(g["passed"].get<bool>());
      continue;
    }
    const int64_t per_side = int64_t(a.heads.size() / 2) * 2;  // (layer, KV head) x holdout windows (2)
    EXPECT_EQ(g["k_head_windows"], per_side) << args;
    EXPECT_EQ(g["v_head_windows"], per_side) << args;
    EXPECT_EQ(g["code_mismatches"], 0) << args;
    EXPECT_EQ(g["byte_mismatches"], 0) << args;
    EXPECT_LE(double(g["max_scaled_diff"]), double(g["decode_tolerance"])) << args;
    const int64_t n_layers = j["n_layers"];
    EXPECT_EQ(g["cache_layers"], n_layers) << args << " " << g["notes"];
    EXPECT_EQ(g["cache_byte_mismatches"], 0) << args;
    EXPECT_EQ(g["cache_code_mismatches"], 0) << args;
    EXPECT_EQ(g["cache_length_errors"], 0) << args;
    // Steps 1, 2, 4, ... and the last of each window: several per (layer, window).
    EXPECT_EQ(int64_t(g["attention_problems"]) % (n_layers * 2), 0) << args;
    EXPECT_GE(g["attention_problems"], n_layers * 2 * 3) << args;
    EXPECT_LE(double(g["attention_max_scaled_diff"]), double(g["attention_tolerance"])) << args;
    EXPECT_TRUE(g["passed"].get<bool>()) << j["cuda"];
  }
}
