// kvq-allocate as users run it, on calibration files of two real models (interleaved and
// split-half RoPE): determinism, energy-following bits, C2 spread, schema, budgets, bad input.
#include <gtest/gtest.h>

#include <H5Cpp.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kvq/io/alloc_file.hpp"
#include "kvq/io/h5.hpp"
#include "kvq/stats/derived.hpp"
#include "kvq/util/sha256.hpp"
#include "run_cmd.hpp"
#include "shared_data.hpp"

using namespace kvq;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string g_stories_cal, g_demo_cal;

std::string stories_cal() {
  if (g_stories_cal.empty()) {
    g_stories_cal = test::temp_path("stories.kvqcal.h5");
    auto r = test::run_cmd("SOURCE_DATE_EPOCH=1 " + test::bin("calib-capture") + " -q --threads 1 --model " +
                           test::shared_path("models/stories260K/stories260K.bin") + " --corpus " +
                           test::shared_path("corpora/wikitext2-train-sample.txt") +
                           " --samples 16 --seq-len 128 --holdout 2 --reservoir-tokens 512 --out " + g_stories_cal);
    EXPECT_EQ(r.status, 0) << r.err;
  }
  return g_stories_cal;
}

// The demo model calibrates in domain on Genesis from Debian's bible-kjv (scripts/test installs it).
std::string demo_cal() {
  if (g_demo_cal.empty()) {
    auto text = test::temp_path("genesis.txt");
    if (test::run_cmd("bible -p /usr/lib gen1:1-gen50:26 > " + text).status != 0) return "";
    g_demo_cal = test::temp_path("demo.kvqcal.h5");
    auto r = test::run_cmd("SOURCE_DATE_EPOCH=1 " + test::bin("calib-capture") + " -q --threads 1 --model " +
                           std::string(KVQ_SOURCE_DIR) + "/data/kvq-demo-llama --corpus " + text +
                           " --samples 16 --seq-len 128 --holdout 2 --reservoir-tokens 512 --out " + g_demo_cal);
    EXPECT_EQ(r.status, 0) << r.err;
  }
  return g_demo_cal;
}

#define REQUIRE_DEMO_CAL()                                                     \
  std::string cal = demo_cal();                                                \
  if (cal.empty()) GTEST_SKIP() << "needs `bible` (Debian bible-kjv) for in-domain text"

test::CmdResult allocate(const std::string& cal, const std::string& out, const std::string& args) {
  return test::run_cmd(test::bin("kvq-allocate") + " -q --calib " + cal + " --out " + out + " " + args);
}

// For every pair of blocks, higher energy never gets fewer bits (Theorem 1's greedy is monotone).
void expect_bits_follow_energy(const std::string& cal, const std::string& alloc) {
  CalibFile c = read_calib(cal, false);
  AllocFile a = read_alloc(alloc);
  RopeGeometry g{c.prov.pairing, c.prov.head_dim, c.prov.rotary_dim};
  int non_uniform = 0;
  for (const auto& h : a.heads) {
    if (h.side != Side::kK) continue;
    auto e = block_energies(c.moments, g, h.layer, h.kv_head);
    ASSERT_EQ(h.block_bits.size(), e.size());
    for (size_t i = 0; i < e.size(); ++i)
      for (size_t j = 0; j < e.size(); ++j)
        if (e[i] > e[j]) EXPECT_GE(h.block_bits[i], h.block_bits[j]) << "layer " << h.layer << " head " << h.kv_head;
    non_uniform += *std::max_element(h.block_bits.begin(), h.block_bits.end()) !=
                   *std::min_element(h.block_bits.begin(), h.block_bits.end());
  }
  EXPECT_GT(non_uniform, 0) << "every head got a flat allocation";
}

// Prints the per-head distortion spread before/after C2 for damped (cobra-mse) and exact (cobra-dp)
// and checks what each promises: exact C2 never has a larger total predicted distortion than damped
// (when damped stays within the budget); damped lowers the spread when `damped_must_lower`.
void check_c2(const std::string& cal, const std::string& name, bool damped_must_lower) {
  for (double bpd : {1.0, 2.0}) {
    json sum[2];
    int i = 0;
    for (std::string method : {"cobra-mse", "cobra-dp"}) {
      auto out = test::temp_path(name + "_" + method + ".kvqalloc.h5");
      auto r = allocate(cal, out, "--method " + method + " --bpd " + std::to_string(bpd));
      ASSERT_EQ(r.status, 0) << r.err;
      AllocFile a = read_alloc(out);
      sum[i++] = a.summary["k"];
      double before = a.summary["k"]["distortion_std_before"], after = a.summary["k"]["distortion_std_after"];
      std::printf("%s %s %.1f bpd: per-head distortion std %.4g -> %.4g (ratio %.2fx), sum D %.4g\n", name.c_str(),
                  method.c_str(), bpd, before, after, before / after, double(a.summary["k"]["predicted_distortion"]));
      if (method == "cobra-mse" && damped_must_lower) EXPECT_LT(after, before) << method << " at " << bpd;
      if (method == "cobra-dp")
        EXPECT_EQ(a.summary["k"]["budget_assigned"], a.summary["k"]["budget_total"]) << "exact C2 must meet the budget";
    }
    if (sum[0]["budget_assigned"] <= sum[0]["budget_total"])
      EXPECT_LE(double(sum[1]["predicted_distortion"]), double(sum[0]["predicted_distortion"]) * (1 + 1e-12))
          << "exact C2 worse than damped at " << bpd;
  }
}

}  // namespace

TEST(AllocateCli, BlockGtqFollowsEnergyStories) {
  KVQ_REQUIRE_SHARED("models/stories260K/stories260K.bin");
  auto out = test::temp_path("s_bg.kvqalloc.h5");
  ASSERT_EQ(allocate(stories_cal(), out, "--method block-gtq --bpd 2").status, 0);
  expect_bits_follow_energy(stories_cal(), out);
}

TEST(AllocateCli, BlockGtqFollowsEnergyDemo) {
  REQUIRE_DEMO_CAL();
  for (const char* bpd : {"2", "3"}) {
    auto out = test::temp_path(std::string("d_bg") + bpd + ".kvqalloc.h5");
    ASSERT_EQ(allocate(cal, out, std::string("--method block-gtq --bpd ") + bpd).status, 0);
    expect_bits_follow_energy(cal, out);
  }
}

TEST(AllocateCli, C2LowersPerHeadDistortionSpread) {
  KVQ_REQUIRE_SHARED("models/stories260K/stories260K.bin");
  // stories260K has d = 8: per-head curves are so coarse that the damped step can widen the spread
  // (reported, not asserted); the demo model (d = 64) is where the paper's claim is checked.
  check_c2(stories_cal(), "stories260K", false);
  std::string cal = demo_cal();
  if (!cal.empty()) check_c2(cal, "demo", true);
}

TEST(AllocateCli, SameInputsSameBytes) {
  REQUIRE_DEMO_CAL();
  for (std::string m : {"uniform", "block-gtq", "cobra-mse", "cobra-kl", "cobra-dp", "cobra-measured"}) {
    auto a = test::temp_path("det_a.kvqalloc.h5"), b = test::temp_path("det_b.kvqalloc.h5");
    ASSERT_EQ(allocate(cal, a, "--method " + m + " --bpd 2").status, 0) << m;
    ASSERT_EQ(allocate(cal, b, "--method " + m + " --bpd 2").status, 0) << m;
    EXPECT_EQ(sha256_file(a), sha256_file(b)) << m;
  }
}

TEST(AllocateCli, ManifestValidatesAgainstSchema) {
  REQUIRE_DEMO_CAL();
  if (test::run_cmd("python3 -c 'import jsonschema'").status != 0)
    GTEST_SKIP() << "needs python3-jsonschema (scripts/test installs it)";
  const std::string schema = std::string(KVQ_SOURCE_DIR) + "/schemas/allocation-manifest.schema.json";
  const std::string check = "python3 -c 'import json,sys,jsonschema; jsonschema.validate(json.load(open(sys.argv[1])), "
                            "json.load(open(sys.argv[2])))' ";
  for (std::string m : {"uniform", "block-gtq", "cobra-kl", "cobra-dp", "cobra-measured"}) {
    auto out = test::temp_path("m.kvqalloc.h5"), man = test::temp_path("m.json");
    ASSERT_EQ(allocate(cal, out, "--method " + m + " --bpd 2 --manifest " + man).status, 0);
    auto r = test::run_cmd(check + man + " " + schema);
    EXPECT_EQ(r.status, 0) << m << ": " << r.err;
  }
  // The validator is real: a manifest with a bad field fails it.
  auto man = test::temp_path("m.json");
  json j = json::parse(std::ifstream(man));
  j["heads"][0]["side"] = "Q";
  std::ofstream(test::temp_path("bad.json")) << j.dump();
  EXPECT_NE(test::run_cmd(check + test::temp_path("bad.json") + " " + schema).status, 0);
}

TEST(AllocateCli, FractionalBudgets) {
  REQUIRE_DEMO_CAL();
  for (const char* bpd : {"0.5", "1.5"}) {
    auto out = test::temp_path("frac.kvqalloc.h5");
    auto r = allocate(cal, out, std::string("--method cobra-dp --v-method cobra-dp --bpd ") + bpd);
    ASSERT_EQ(r.status, 0) << r.err;
    AllocFile a = read_alloc(out);
    const double d = a.calib.head_dim, heads = a.calib.n_layers * a.calib.n_kv_heads;
    EXPECT_EQ(double(a.summary["k"]["budget_assigned"]), std::llround(heads * d * std::stod(bpd)));
    long used = 0;
    for (const auto& h : a.heads)
      if (h.side == Side::kK) used += h.budget_bits;
    EXPECT_EQ(double(used), std::llround(heads * d * std::stod(bpd))) << "budget met exactly";
  }
  // Block-GTQ floors to whole block-bits per head and records what it used.
  auto out = test::temp_path("bg_frac.kvqalloc.h5");
  ASSERT_EQ(allocate(cal, out, "--method block-gtq --bpd 2.5").status, 0);
  AllocFile a = read_alloc(out);
  EXPECT_DOUBLE_EQ(double(a.summary["k"]["code_bits_per_dim"]), 2.5);
  EXPECT_GT(a.k_bpd_effective, 2.5) << "norms count in the effective bpd";
}

TEST(AllocateCli, OptionalFlagsChangeWhatTheySay) {
  REQUIRE_DEMO_CAL();
  auto plain = test::temp_path("p.kvqalloc.h5"), exact = test::temp_path("e.kvqalloc.h5");
  ASSERT_EQ(allocate(cal, plain, "--method block-gtq --bpd 2").status, 0);
  ASSERT_EQ(allocate(cal, exact, "--method block-gtq --bpd 2 --exact-distortion").status, 0);
  AllocFile p = read_alloc(plain), e = read_alloc(exact);
  int moved = 0;
  for (size_t i = 0; i < p.heads.size(); ++i) moved += p.heads[i].block_bits != e.heads[i].block_bits;
  std::printf("--exact-distortion changed the block bits of %d of %zu K heads\n", moved, p.heads.size() / 2);
  EXPECT_GT(moved, 0);
  EXPECT_TRUE(bool(e.params["exact_distortion"]));

  auto joint = test::temp_path("j.kvqalloc.h5");
  auto r = allocate(cal, joint, "--method cobra-dp --bpd 2 --joint-kv");
  ASSERT_EQ(r.status, 0) << r.err;
  AllocFile j = read_alloc(joint);
  long k = 0, v = 0;
  for (const auto& h : j.heads) (h.side == Side::kK ? k : v) += h.budget_bits;
  const long total = std::lround(2.0 * j.calib.n_layers * j.calib.n_kv_heads * j.calib.head_dim * 2.0);
  std::printf("--joint-kv at 2 bpd: K gets %ld bits, V %ld bits per token (of %ld)\n", k, v, total);
  EXPECT_EQ(k + v, total);
  EXPECT_NE(k, v) << "the joint split should differ from an even one on real K/V spectra";

  // --c2 reference: the KV-COBRA reference code's budgets. Without C2 rounds every head keeps
  // int(d * bpd) = int(64 * 1.7) = 108 bits (kvq's own rule splits llround(8 * 64 * 1.7) = 870
  // over 8 heads: 109 or 108); with rounds, truncation only ever loses bits.
  auto ref0 = test::temp_path("r0.kvqalloc.h5"), ref = test::temp_path("r.kvqalloc.h5");
  r = allocate(cal, ref0, "--method cobra-mse --bpd 1.7 --c2 reference --rounds 0");
  ASSERT_EQ(r.status, 0) << r.err;
  AllocFile a0 = read_alloc(ref0);
  EXPECT_EQ(a0.params["c2"], "reference");
  for (const auto& h : a0.heads)
    if (h.side == Side::kK) EXPECT_EQ(h.budget_bits, 108) << "layer " << h.layer << " head " << h.kv_head;
  r = allocate(cal, ref, "--method cobra-mse --bpd 1.7 --c2 reference");
  ASSERT_EQ(r.status, 0) << r.err;
  long sum = 0;
  for (const auto& h : read_alloc(ref).heads) sum += h.side == Side::kK ? h.budget_bits : 0;
  EXPECT_LE(sum, 8 * 108);
  r = allocate(cal, test::temp_path("rdp.kvqalloc.h5"), "--method cobra-dp --bpd 2 --c2 reference");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--c2"), std::string::npos) << r.err;
}

TEST(AllocateCli, BadInputs) {
  KVQ_REQUIRE_SHARED("models/stories260K/stories260K.bin");
  const std::string cal = stories_cal();
  auto future = test::temp_path("future.kvqcal.h5");
  fs::copy_file(cal, future, fs::copy_options::overwrite_existing);
  {
    h5::quiet();
    H5::H5File f(future, H5F_ACC_RDWR);
    H5::Group g = f.openGroup("/");
    g.removeAttr("version");
    h5::write_attr(g, "version", int64_t(99));
  }
  auto partial = test::temp_path("partial.kvqcal.h5");
  test::run_cmd("KVQ_TEST_KILL_AFTER_WINDOWS=4 " + test::bin("calib-capture") + " -q --threads 1 --model " +
                test::shared_path("models/stories260K/stories260K.bin") + " --corpus " +
                test::shared_path("corpora/wikitext2-train-sample.txt") +
                " --samples 8 --seq-len 64 --batch 2 --checkpoint-every 2 --out " + partial);
  struct Case {
    std::string args, expect;
  };
  std::vector<Case> cases = {
      {"--calib " + cal + " --method block-gtq --bpd 0", "--bpd"},
      {"--calib " + cal + " --method block-gtq --bpd -1", "--bpd"},
      {"--calib " + cal + " --method block-gtq --bpd 9", "above b_max 8"},
      {"--calib " + cal + " --method magic --bpd 2",
       "--method: unknown method 'magic' (uniform, block-gtq, cobra-mse, cobra-kl, cobra-dp, cobra-measured, "
       "layer-precision, vllm-turboquant)"},
      {"--calib " + cal + " --method kivi --bpd 2", "unknown method 'kivi'"},  // a kvq-verify baseline only
      {"--calib " + cal + " --v-method magic --bpd 2", "--v-method: unknown method 'magic'"},
      {"--calib " + cal + " --v-method cobra-kl --bpd 2",
       "--v-method: 'cobra-kl' allocates keys only (it needs RoPE blocks / queries); use uniform, cobra-mse, "
       "cobra-dp, cobra-measured, layer-precision or vllm-turboquant for V"},
      {"--calib " + cal + " --method cobra-kl --joint-kv --bpd 2", "--joint-kv"},
      {"--calib " + cal + " --method uniform --bpd 2.5", "bits_per_dim"},
      {"--calib " + future + " --method block-gtq --bpd 2", "found 99 (written by a newer kvq)"},
      {"--calib " + partial + " --method block-gtq --bpd 2", "interrupted capture"},
      {"--calib /nonexistent.kvqcal.h5 --method block-gtq --bpd 2", "cannot open"},
      {"--calib " + cal + " --method cobra-dp --c1-rounding round --bpd 2", "round"},
  };
  for (const auto& c : cases) {
    auto out = test::temp_path("never.kvqalloc.h5");
    fs::remove(out);
    auto r = test::run_cmd(test::bin("kvq-allocate") + " -q " + c.args + " --out " + out);
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.args << " -> " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(out)) << c.args;
  }
}
