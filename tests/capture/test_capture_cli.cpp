// calib-capture as a user runs it: resume after a real SIGKILL, merge, bounded memory, bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include <H5Cpp.h>

#include "kvq/io/calib_file.hpp"
#include "kvq/io/h5.hpp"
#include "kvq/util/sha256.hpp"
#include "run_cmd.hpp"
#include "shared_data.hpp"

using namespace kvq;
namespace fs = std::filesystem;

namespace {

const std::string kStories = "models/stories260K/stories260K.bin";
const std::string kWiki = "corpora/wikitext2-train-sample.txt";

std::string capture_cmd(const std::string& out, const std::string& extra) {
  return "SOURCE_DATE_EPOCH=1700000000 " + test::bin("calib-capture") + " -q --threads 1 --model " +
         test::shared_path(kStories) + " --corpus " + test::shared_path(kWiki) +
         " --seq-len 64 --holdout 2 --batch 2 --reservoir-tokens 64 --seed 5 --out " + out + " " + extra;
}

void expect_same_datasets(const CalibFile& a, const CalibFile& b) {
  for (auto [x, y] : {std::make_pair(&a.moments.k, &b.moments.k), std::make_pair(&a.moments.v, &b.moments.v),
                      std::make_pair(&a.moments.q, &b.moments.q)}) {
    ASSERT_EQ(x->count, y->count);
    ASSERT_EQ(0, std::memcmp(x->sum.data(), y->sum.data(), x->sum.size() * sizeof(double)));
    ASSERT_EQ(0, std::memcmp(x->gram.data(), y->gram.data(), x->gram.size() * sizeof(double)));
  }
  EXPECT_EQ(a.reservoir.source, b.reservoir.source);
  EXPECT_EQ(a.reservoir.k, b.reservoir.k);
  EXPECT_EQ(a.holdout.q, b.holdout.q);
}

double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0, scale = 0;
  for (double x : b) scale = std::max(scale, std::fabs(x));
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]) / scale);
  return m;
}

// Whether the file's provenance text (the root's attribute) names `key` at all.
bool read_text_attr_json_has(const std::string& path, const std::string& key) {
  H5::H5File f(path, H5F_ACC_RDONLY);
  H5::Group g = f.openGroup("/");
  return h5::read_attr_str(path, g, "provenance").find("\"" + key + "\"") != std::string::npos;
}

}  // namespace

TEST(CaptureCli, ResumeAfterKillIsByteIdentical) {
  KVQ_REQUIRE_SHARED(kStories);
  auto full = test::temp_path("full.kvqcal.h5"), part = test::temp_path("part.kvqcal.h5");
  fs::remove(full);
  fs::remove(part);
  auto r = test::run_cmd(capture_cmd(full, "--samples 12"));
  ASSERT_EQ(r.status, 0) << r.err;
  // SIGKILL after window 6 with checkpoints every 4: the file holds 4 windows; resume finishes.
  r = test::run_cmd("KVQ_TEST_KILL_AFTER_WINDOWS=6 " + capture_cmd(part, "--samples 12 --checkpoint-every 4"));
  ASSERT_EQ(r.status, 128 + 9) << "expected death by SIGKILL: " << r.err;
  ASSERT_TRUE(fs::exists(part));
  EXPECT_EQ(read_calib(part, false).windows_done, 4);
  r = test::run_cmd(capture_cmd(part, "--samples 12 --checkpoint-every 4 --resume"));
  ASSERT_EQ(r.status, 0) << r.err;
  CalibFile a = read_calib(full), b = read_calib(part);
  ASSERT_TRUE(b.complete());
  expect_same_datasets(a, b);
  EXPECT_EQ(sha256_file(full), sha256_file(part)) << "the whole file, not only its datasets";
}

TEST(CaptureCli, ResumeRefusesADifferentRun) {
  KVQ_REQUIRE_SHARED(kStories);
  auto part = test::temp_path("part2.kvqcal.h5");
  fs::remove(part);
  auto r = test::run_cmd("KVQ_TEST_KILL_AFTER_WINDOWS=2 " + capture_cmd(part, "--samples 6 --checkpoint-every 2"));
  ASSERT_TRUE(fs::exists(part));
  r = test::run_cmd(capture_cmd(part, "--samples 6 --checkpoint-every 2 --resume --seed 6"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("provenance.seed"), std::string::npos) << r.err;
}

TEST(CaptureCli, MergeEqualsOneRunOverTheUnion) {
  KVQ_REQUIRE_SHARED(kStories);
  auto all = test::temp_path("all.kvqcal.h5"), a = test::temp_path("a.kvqcal.h5"), b = test::temp_path("b.kvqcal.h5"),
       m = test::temp_path("m.kvqcal.h5");
  ASSERT_EQ(test::run_cmd(capture_cmd(all, "--samples 8")).status, 0);
  ASSERT_EQ(test::run_cmd(capture_cmd(a, "--samples 8 --windows 0:3")).status, 0);
  ASSERT_EQ(test::run_cmd(capture_cmd(b, "--samples 8 --windows 3:8")).status, 0);
  auto r = test::run_cmd(test::bin("calib-capture") + " -q merge " + a + " " + b + " --out " + m);
  ASSERT_EQ(r.status, 0) << r.err;
  CalibFile x = read_calib(all, false), y = read_calib(m, false);
  EXPECT_EQ(x.calib_offsets, y.calib_offsets);
  EXPECT_EQ(x.moments.k.count, y.moments.k.count);
  // The parts batch their windows differently from the single run (a batch never spans 2→3 here),
  // and a GEMM's rounding may depend on its row count (OpenBLAS on an AMD EPYC: 1.6e-8 relative on
  // the K Gram), so the moments agree to fp32 rounding, not bit for bit. A merge that dropped or
  // doubled a window would be off by ~1/8 and fail the exact counts above.
  EXPECT_LT(max_rel(y.moments.k.gram, x.moments.k.gram), 1e-6);
  EXPECT_LT(max_rel(y.moments.q.gram, x.moments.q.gram), 1e-6);
  EXPECT_LT(max_rel(y.moments.v.sum, x.moments.v.sum), 1e-6);
  // Activation maxima merge by max: the union's, to the same fp32 rounding of the activations.
  ASSERT_TRUE(y.moments.has_amax());
  EXPECT_LT(max_rel(std::vector<double>(y.moments.k_amax.begin(), y.moments.k_amax.end()),
                    std::vector<double>(x.moments.k_amax.begin(), x.moments.k_amax.end())), 1e-6);
  EXPECT_LT(max_rel(std::vector<double>(y.moments.q_amax.begin(), y.moments.q_amax.end()),
                    std::vector<double>(x.moments.q_amax.begin(), x.moments.q_amax.end())), 1e-6);
  // Overlapping windows are refused, naming the field.
  r = test::run_cmd(test::bin("calib-capture") + " -q merge " + a + " " + all + " --out " + m + "x");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("calib_offsets"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(m + "x"));
}

TEST(CaptureCli, MergeRefusesAnotherModel) {
  KVQ_REQUIRE_SHARED(kStories);
  auto a = test::temp_path("sa.kvqcal.h5"), d = test::temp_path("da.kvqcal.h5"), m = test::temp_path("dm.kvqcal.h5");
  ASSERT_EQ(test::run_cmd(capture_cmd(a, "--samples 2")).status, 0);
  auto r = test::run_cmd(test::bin("calib-capture") + " -q --model " + KVQ_SOURCE_DIR + "/data/kvq-demo-llama --corpus " +
                         test::shared_path(kWiki) + " --samples 2 --seq-len 32 --holdout 0 --out " + d);
  ASSERT_EQ(r.status, 0) << r.err;
  r = test::run_cmd(test::bin("calib-capture") + " -q merge " + a + " " + d + " --out " + m);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("model_config_sha256"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(m));
}

TEST(CaptureCli, PeakMemoryDoesNotGrowWithSamples) {
  KVQ_REQUIRE_SHARED(kStories);
  auto a = test::temp_path("rss_a.kvqcal.h5"), b = test::temp_path("rss_b.kvqcal.h5");
  auto ra = test::run_cmd(capture_cmd(a, "--samples 8"));
  auto rb = test::run_cmd(capture_cmd(b, "--samples 128"));
  ASSERT_EQ(ra.status, 0);
  ASSERT_EQ(rb.status, 0);
  std::printf("peak RSS: %ld KiB at 8 windows, %ld KiB at 128 windows\n", ra.max_rss_kb, rb.max_rss_kb);
  EXPECT_LT(double(rb.max_rss_kb), 1.05 * double(ra.max_rss_kb) + 8192) << "RSS grew with --samples";
}

TEST(CaptureCli, BadInputsGiveOneLineAndNoFile) {
  KVQ_REQUIRE_SHARED(kStories);
  auto empty = test::temp_path("empty.txt"), bad = test::temp_path("bad_utf8.txt");
  test::write_text(empty, "");
  test::write_text(bad, "Once upon a time\xC3\x28 there was");
  auto future = test::temp_path("future.kvqcal.h5");
  test::write_text(future, "\x89HDF\r\n\x1a\n garbage after a valid signature");
  struct Case {
    std::string args, expect;
  };
  std::vector<Case> cases = {
      {"--corpus " + empty, "empty"},
      {"--corpus " + bad, "offset 16"},
      {"--corpus " + test::shared_path(kWiki) + " --seq-len 1024", "exceeds the model's maximum 512"},
      {"--corpus " + test::shared_path(kWiki) + " --samples 100000", "corpus too short"},
      {"--corpus /nonexistent/x.txt", "no such file"},
  };
  for (const auto& c : cases) {
    auto out = test::temp_path("never.kvqcal.h5");
    fs::remove(out);
    auto r = test::run_cmd(test::bin("calib-capture") + " -q --model " + test::shared_path(kStories) + " --samples 2 " +
                           c.args + " --out " + out);
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.args << " -> " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(out)) << c.args;
  }
  // Resuming from a corrupt file names it.
  auto r = test::run_cmd(capture_cmd(future, "--samples 2 --resume"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find(future), std::string::npos) << r.err;
}

// ---------------------------------------------------------------- --precision (issue 37)

// --precision fp32 is the run the tests' environment (KVQ_PRECISION=fp32) gives, byte for byte,
// and records nothing new (fp32 files keep the fields older files have); bf16 is recorded in the
// provenance, moves the statistics by a BF16-sized amount, and is refused on resume against an
// fp32 file (another arithmetic, other statistics).
TEST(CaptureCli, PrecisionFlagRecordedAndFp32Unchanged) {
  KVQ_REQUIRE_SHARED(kStories);
  auto env = test::temp_path("p_env.kvqcal.h5"), flag = test::temp_path("p_flag.kvqcal.h5");
  auto bf = test::temp_path("p_bf16.kvqcal.h5"), part = test::temp_path("p_part.kvqcal.h5");
  for (const auto& p : {env, flag, bf, part}) fs::remove(p);
  auto r = test::run_cmd("KVQ_PRECISION=fp32 " + capture_cmd(env, "--samples 4"));
  ASSERT_EQ(r.status, 0) << r.err;
  r = test::run_cmd("KVQ_PRECISION=bf16 " + capture_cmd(flag, "--samples 4 --precision fp32"));  // the flag wins
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(sha256_file(env), sha256_file(flag));
  const CalibFile a = read_calib(flag);
  EXPECT_EQ(a.prov.forward_precision, "fp32");
  EXPECT_EQ(read_text_attr_json_has(flag, "forward_precision"), false);

  r = test::run_cmd(capture_cmd(bf, "--samples 4 --precision bf16"));
  ASSERT_EQ(r.status, 0) << r.err;
  const CalibFile b = read_calib(bf);
  EXPECT_EQ(b.prov.forward_precision, "bf16");
  EXPECT_EQ(read_text_attr_json_has(bf, "forward_precision"), true);
  // The same windows; K's second moments within a few BF16 roundings of the fp32 ones, not equal.
  EXPECT_EQ(a.calib_offsets, b.calib_offsets);
  const double d = max_rel(b.moments.k.gram, a.moments.k.gram);
  std::printf("K second moments, bf16 vs fp32: max rel diff %.3g\n", d);
  EXPECT_GT(d, 1e-5);
  EXPECT_LT(d, 0.05);

  // Resume across precisions is refused, naming the field.
  r = test::run_cmd("KVQ_TEST_KILL_AFTER_WINDOWS=2 " + capture_cmd(part, "--samples 6 --checkpoint-every 2 --precision bf16"));
  ASSERT_TRUE(fs::exists(part));
  r = test::run_cmd(capture_cmd(part, "--samples 6 --checkpoint-every 2 --resume --precision fp32"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("provenance.forward_precision"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;

  // Bad values: the flag (CLI usage, exit 2) and the variable, one line each, no file.
  for (const std::string& bad : {std::string("--precision fp16"), std::string("KVQ_PRECISION=half")}) {
    auto out = test::temp_path("p_never.kvqcal.h5");
    fs::remove(out);
    const bool var = bad.rfind("KVQ_", 0) == 0;
    r = test::run_cmd((var ? bad + " " : std::string()) + capture_cmd(out, "--samples 2 " + (var ? std::string() : bad)));
    EXPECT_NE(r.status, 0) << bad;
    EXPECT_NE(r.err.find(var ? "KVQ_PRECISION" : "--precision"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(var ? "half" : "fp16"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(out));
  }
  for (const auto& p : {env, flag, bf, part}) fs::remove(p);
}

// auto (the default without KVQ_PRECISION) is bf16 exactly when the kernel reports AVX512-BF16 or
// AMX-BF16 for this CPU (/proc/cpuinfo's flags), and the tool says which it took.
TEST(CaptureCli, AutoPrecisionFollowsTheCpuFlags) {
  KVQ_REQUIRE_SHARED(kStories);
  std::ifstream cpuinfo("/proc/cpuinfo");
  if (!cpuinfo) GTEST_SKIP() << "no /proc/cpuinfo";
  std::string line;
  bool bf16 = false;
  while (std::getline(cpuinfo, line))
    if (line.rfind("flags", 0) == 0) {
      bf16 = line.find(" avx512_bf16") != std::string::npos || line.find(" amx_bf16") != std::string::npos;
      break;
    }
  auto out = test::temp_path("p_auto.kvqcal.h5");
  fs::remove(out);
  const std::string cmd = capture_cmd(out, "--samples 2 --precision auto");
  // Without -q, to read the line that names the precision.
  auto r = test::run_cmd("env -u KVQ_PRECISION " + std::regex_replace(cmd, std::regex(" -q "), " "));
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string want = std::string("forward precision: ") + (bf16 ? "bf16" : "fp32");
  EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
  EXPECT_EQ(read_calib(out).prov.forward_precision, bf16 ? "bf16" : "fp32");
  fs::remove(out);
}
