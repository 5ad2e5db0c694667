// kvq-verify --match effective: the baseline's bits per side are the whole bits with the smallest
// effective bpd >= the allocation's (the widest of those with that effective bpd). The truth here is a brute force over the admissible budgets
// (whole bits 1..8) with effective bpd worked out in this file from the packed-layout rules
// (schemas/packed-layout.md): a block is [records][codes][pad to 2 bytes]; TQ records are one fp16
// norm per group, low rank one fp16 norm, KIVI K one (scale, zero) fp16 pair per channel for 32
// tokens, KIVI V one pair per 32 channels; effective bpd = block bits / (tokens per block * d).
// Also: the report names both budgets, validates against schemas/verify-report.schema.json, and
// the usage errors are one line with exit 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
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

// ---- effective bpd from the layout rules, written here ----
long align2(long bytes) { return (bytes + 1) / 2 * 2; }
long bytes_of_bits(long bits) { return (bits + 7) / 8; }

double head_bpd(const kvq::HeadDecision& h, int d) {
  long block = 0, tokens = 1;
  switch (h.kind) {
    case kvq::CodingKind::kTqGroups: {
      long code_bits = 0;
      for (const auto& g : h.groups) code_bits += long(g.dims.size()) * g.bits;
      // One fp16 norm per group, or with compact group norms one 16-bit record per token.
      block = align2((h.ratio_bits > 0 ? 2 : 2 * long(h.groups.size())) + bytes_of_bits(code_bits));
      break;
    }
    case kvq::CodingKind::kLowRankHadamard: block = align2(2 + bytes_of_bits(long(h.rank) * h.bits)); break;
    default: ADD_FAILURE() << "no layout rule written for this kind in the test"; return 0;
  }
  return double(block) * 8 / (double(tokens) * d);
}

double side_bpd(const kvq::AllocFile& a, kvq::Side s, int d) {
  double sum = 0;
  int n = 0;
  for (const auto& h : a.heads)
    if (h.side == s) sum += head_bpd(h, d), ++n;
  return sum / n;
}

// The baselines' layouts at b bits: the same for every head.
double uniform_bpd(int b, int d) { return double(align2(2 + bytes_of_bits(long(d) * b))) * 8 / d; }
double kivi_bpd(kvq::Side s, int b, int d) {
  if (s == kvq::Side::kK) return double(align2(4L * d + bytes_of_bits(32L * d * b))) * 8 / (32.0 * d);
  return double(align2(4L * ((d + 31) / 32) + bytes_of_bits(long(d) * b))) * 8 / d;
}

// Brute force: of every admissible budget reaching target, those with the smallest effective bpd,
// the widest of them (the same bytes hold more bits); 0 when none reaches it.
int brute_force(const std::string& kind, kvq::Side s, double target, int d, double* eff) {
  int best = 0;
  for (int b = 1; b <= 8; ++b) {
    const double e = kind == "uniform" ? uniform_bpd(b, d) : kivi_bpd(s, b, d);
    if (e < target - 1e-9) continue;
    if (best == 0 || e < *eff - 1e-9 || (std::fabs(e - *eff) <= 1e-9 && b > best)) best = b, *eff = e;
  }
  return best;
}

struct VerifyRun {
  int status = -1;
  std::string out, err;
  json j;
};

VerifyRun verify(const std::string& cal, const std::string& alloc, const std::string& args) {
  auto path = temp_path("me_verify.json"), text = temp_path("me_verify.txt");
  fs::remove(path);
  auto r = run_cmd(bin("kvq-verify") + " --calib " + cal + " --alloc " + alloc + " --json " + path + " " + args +
                   " > " + text);
  VerifyRun x{r.status, "", r.err, json()};
  std::ifstream t(text);
  x.out.assign(std::istreambuf_iterator<char>(t), std::istreambuf_iterator<char>());
  if (fs::exists(path)) x.j = json::parse(std::ifstream(path));
  return x;
}

bool have_jsonschema() { return run_cmd("python3 -c 'import jsonschema'").status == 0; }

// The report validates against the schema (python3-jsonschema, not kvq's code); a broken copy must not.
void validate(const json& j) {
  if (!have_jsonschema()) {
    std::printf("python3-jsonschema missing: verify report schema not checked (scripts/test installs it)\n");
    return;
  }
  const std::string schema = std::string(KVQ_SOURCE_DIR) + "/schemas/verify-report.schema.json";
  const std::string check =
      "python3 -c 'import json,sys,jsonschema; s=json.load(open(sys.argv[2])); "
      "jsonschema.Draft202012Validator.check_schema(s); jsonschema.validate(json.load(open(sys.argv[1])), s)' ";
  const auto good = temp_path("me_good.json"), bad = temp_path("me_bad.json");
  kvq::test::write_text(good, j.dump());
  auto r = run_cmd(check + good + " " + schema);
  EXPECT_EQ(r.status, 0) << r.err;
  json broken = j;
  broken["match"] = "equal";
  kvq::test::write_text(bad, broken.dump());
  EXPECT_NE(run_cmd(check + bad + " " + schema).status, 0) << "the schema must reject match 'equal'";
}

int one_line(const std::string& s) { return int(std::count(s.begin(), s.end(), '\n')); }

// Checks --match effective (and nominal) of one allocation against the brute force.
void check_match(const std::string& cal, const std::string& alloc, const std::string& baseline, int d,
                 const std::string& label) {
  const kvq::AllocFile a = kvq::read_alloc(alloc);
  const double ak = side_bpd(a, kvq::Side::kK, d), av = side_bpd(a, kvq::Side::kV, d);
  double ek = 0, ev = 0;
  const int bk = brute_force(baseline, kvq::Side::kK, ak, d, &ek), bv = brute_force(baseline, kvq::Side::kV, av, d, &ev);
  ASSERT_GT(bk, 0) << label;
  ASSERT_GT(bv, 0) << label;
  VerifyRun r = verify(cal, alloc, "--baseline " + baseline + " --match effective");
  ASSERT_EQ(r.status, 0) << label << ": " << r.err;
  const auto& A = r.j["allocation"];
  const auto& B = r.j["baseline"];
  std::printf("%s vs %s, --match effective: K alloc %.4f eff (nominal %g) -> baseline %d bits (%.4f eff); "
              "V alloc %.4f eff (nominal %g) -> %d bits (%.4f eff)\n",
              label.c_str(), baseline.c_str(), ak, double(A["k_bpd_nominal"]), bk, ek, av,
              double(A["v_bpd_nominal"]), bv, ev);
  EXPECT_EQ(r.j["match"], "effective");
  EXPECT_NEAR(double(A["k_bpd_effective"]), ak, 1e-9) << label;
  EXPECT_NEAR(double(A["v_bpd_effective"]), av, 1e-9) << label;
  EXPECT_EQ(double(B["k_bpd_nominal"]), bk) << label;
  EXPECT_EQ(double(B["v_bpd_nominal"]), bv) << label;
  EXPECT_NEAR(double(B["k_bpd_effective"]), ek, 1e-9) << label;
  EXPECT_NEAR(double(B["v_bpd_effective"]), ev, 1e-9) << label;
  EXPECT_GE(double(B["k_bpd_effective"]), double(A["k_bpd_effective"]) - 1e-9);
  // Both budgets are in the text report.
  EXPECT_NE(r.out.find("baseline budget: --match effective"), std::string::npos) << r.out;
  char buf[64];
  std::snprintf(buf, sizeof buf, "K bpd nominal %d effective", bk);
  EXPECT_NE(r.out.find(buf), std::string::npos) << buf << "\n" << r.out;
  validate(r.j);

  // nominal (the default) is today's comparison: the allocation's nominal bits, match "nominal";
  // a fractional nominal budget has no nominal baseline (exit 2, as before).
  VerifyRun n = verify(cal, alloc, "--baseline " + baseline);
  if (a.k_bpd_nominal != std::floor(a.k_bpd_nominal)) {
    EXPECT_EQ(n.status, 2) << n.err;
    return;
  }
  ASSERT_EQ(n.status, 0) << n.err;
  EXPECT_EQ(n.j["match"], "nominal");
  EXPECT_EQ(double(n.j["baseline"]["k_bpd_nominal"]), double(A["k_bpd_nominal"]));
  EXPECT_EQ(double(n.j["baseline"]["v_bpd_nominal"]), double(A["v_bpd_nominal"]));
  EXPECT_EQ(n.out.find("baseline budget:"), std::string::npos) << "the nominal text report is unchanged";
  // The allocation's own figures do not depend on the baseline's budget.
  EXPECT_EQ(n.j["allocation"].dump(), r.j["allocation"].dump());
  validate(n.j);
}

}  // namespace

TEST(MatchEffective, BlockGtqDemoAgainstBruteForce) {
  std::string cal = demo_cal("me");
  if (cal.empty()) GTEST_SKIP() << "needs `bible` (Debian bible-kjv)";
  for (int b : {2, 3})
    check_match(cal, allocate(cal, "--method block-gtq --bpd " + std::to_string(b), "me_bg"), "uniform", 64,
                "kvq-demo-llama block-gtq K" + std::to_string(b));
  check_match(cal, allocate(cal, "--method block-gtq --bpd 3", "me_bg3"), "kivi", 64, "kvq-demo-llama block-gtq K3");
  // A fractional nominal budget (no nominal baseline exists) has an effective match.
  check_match(cal, allocate(cal, "--method block-gtq --bpd 2.5 --v-method cobra-mse", "me_bg25"), "uniform", 64,
              "kvq-demo-llama block-gtq/cobra-mse 2.5");
}

TEST(MatchEffective, ExplicitBaselineBitsAreAUsageError) {
  std::string cal = demo_cal("me");
  if (cal.empty()) GTEST_SKIP() << "needs `bible` (Debian bible-kjv)";
  const auto alloc = allocate(cal, "--method block-gtq --bpd 3", "me_usage");
  for (const char* extra : {"--baseline-k-bpd 3", "--baseline-v-bpd 4"}) {
    VerifyRun r = verify(cal, alloc, std::string("--match effective ") + extra);
    EXPECT_EQ(r.status, 2) << extra;
    EXPECT_EQ(one_line(r.err), 1) << r.err;
    EXPECT_NE(r.err.find("--match"), std::string::npos) << r.err;
    EXPECT_TRUE(r.j.is_null()) << "no report written";
  }
  VerifyRun r = verify(cal, alloc, "--match equal");
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(r.j.is_null());
}

// stories260K has d = 8: a 2-group Block-GTQ K at 7.5 nominal with fp16 group norms stores 4 norm
// bytes + 60 code bits = 12 bytes per token (12 bpd) against uniform's 10 bpd at 8 bits: no
// admissible budget reaches it. (With compact group norms it stores 10 bytes, as uniform 8 does.)
TEST(MatchEffective, UnreachableBudgetIsOneLineError) {
  KVQ_REQUIRE_SHARED("models/stories260K/stories260K.bin");
  const auto cal = stories_cal("me");
  const auto alloc = allocate(cal, "--method block-gtq --bpd 7.5 --group-norms fp16", "me_unreach");
  const kvq::AllocFile a = kvq::read_alloc(alloc);
  const double ak = side_bpd(a, kvq::Side::kK, 8);
  double e = 0;
  ASSERT_GT(ak, uniform_bpd(8, 8)) << "precondition: the allocation's K is above uniform 8 bits";
  ASSERT_EQ(brute_force("uniform", kvq::Side::kK, ak, 8, &e), 0);
  VerifyRun r = verify(cal, alloc, "--match effective");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(one_line(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("--match"), std::string::npos) << r.err;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", ak);
  EXPECT_NE(r.err.find(buf), std::string::npos) << "names the allocation's effective bpd " << buf << ": " << r.err;
  EXPECT_NE(r.err.find("10.0000"), std::string::npos) << "names the widest baseline's: " << r.err;
  EXPECT_TRUE(r.j.is_null());
}
