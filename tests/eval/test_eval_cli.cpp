// kvq-eval as users run it: calibration and allocation files made with the tools from Genesis (the
// demo model's own domain), perplexity on Exodus (disjoint), the held-out check, bad inputs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "kvq/eval/overlap.hpp"
#include "kvq/io/alloc_file.hpp"
#include "kvq/io/calib_file.hpp"
#include "kvq/tokenizer/tokenizer.hpp"
#include "run_cmd.hpp"

using namespace kvq;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::string kDemo = std::string(KVQ_SOURCE_DIR) + "/data/kvq-demo-llama";
std::string g_cal, g_genesis, g_exodus;

// Genesis calibrates (as in tests/pipeline); Exodus is the held-out text. Empty without `bible`.
bool texts() {
  if (!g_exodus.empty()) return true;
  g_genesis = test::temp_path("genesis.txt");
  auto exodus = test::temp_path("exodus.txt");
  if (test::run_cmd("bible -p /usr/lib gen1:1-gen50:26 > " + g_genesis).status != 0) return false;
  if (test::run_cmd("bible -p /usr/lib ex1:1-ex12:51 > " + exodus).status != 0) return false;
  g_exodus = exodus;
  return true;
}

std::string cal() {
  if (g_cal.empty()) {
    g_cal = test::temp_path("demo.kvqcal.h5");
    auto r = test::run_cmd("SOURCE_DATE_EPOCH=1 " + test::bin("calib-capture") + " -q --threads 1 --model " + kDemo +
                           " --corpus " + g_genesis + " --samples 16 --seq-len 128 --holdout 2 --out " + g_cal);
    EXPECT_EQ(r.status, 0) << r.err;
  }
  return g_cal;
}

std::string allocation(const std::string& name, const std::string& args) {
  auto out = test::temp_path(name + ".kvqalloc.h5");
  if (!fs::exists(out)) {
    auto r = test::run_cmd(test::bin("kvq-allocate") + " -q --calib " + cal() + " --out " + out + " " + args);
    EXPECT_EQ(r.status, 0) << args << ": " << r.err;
  }
  return out;
}

#define REQUIRE_TEXTS() \
  if (!texts()) GTEST_SKIP() << "needs `bible` (Debian bible-kjv) for in-domain text"

// Runs kvq-eval on the demo model; returns the JSON report (null on failure, status in *status).
json eval(const std::string& args, test::CmdResult* res = nullptr) {
  auto out = test::temp_path("eval.json");
  fs::remove(out);
  auto r = test::run_cmd(test::bin("kvq-eval") + " -q --threads 2 --model " + kDemo + " " + args + " --json " + out);
  if (res) *res = r;
  EXPECT_EQ(r.status, 0) << args << ": " << r.err;
  if (r.status != 0) return json();
  return json::parse(std::ifstream(out));
}

const std::string kFast = " --window 128 --stride 64 --max-tokens 2048";

double ppl(const json& j, size_t row) { return j["rows"][row]["ppl"]; }

// The report eval() wrote last validates against schemas/eval-report.schema.json (python3-jsonschema,
// a validator that is not ours); a copy with a field broken must not.
void validate_last_report(bool check_negative) {
  if (test::run_cmd("python3 -c 'import jsonschema'").status != 0) {
    std::printf("python3-jsonschema missing: report schema not checked (scripts/test installs it)\n");
    return;
  }
  const std::string check = "python3 -c 'import json,sys,jsonschema; jsonschema.validate(json.load(open(sys.argv[1])), "
                            "json.load(open(sys.argv[2])))' ";
  const std::string schema = std::string(KVQ_SOURCE_DIR) + "/schemas/eval-report.schema.json";
  const auto report = test::temp_path("eval.json");
  auto r = test::run_cmd(check + report + " " + schema);
  EXPECT_EQ(r.status, 0) << r.err;
  if (!check_negative) return;
  json j = json::parse(std::ifstream(report));
  j["rows"][1]["ppl"] = -1;
  const auto broken = test::temp_path("eval-broken.json");
  test::write_text(broken, j.dump());
  EXPECT_NE(test::run_cmd(check + broken + " " + schema).status, 0) << "the schema must reject ppl -1";
}

}  // namespace

TEST(EvalCli, EightBitsIsFp32OneBitIsWorse) {
  REQUIRE_TEXTS();
  auto a8 = allocation("u8", "--method uniform --bpd 8");
  auto a1 = allocation("u1", "--method uniform --bpd 1");
  json j8 = eval("--alloc " + a8 + " --text " + g_exodus + " --calib " + cal() + kFast);
  json j1 = eval("--alloc " + a1 + " --text " + g_exodus + " --calib " + cal() + kFast);
  ASSERT_FALSE(j8.is_null());
  ASSERT_FALSE(j1.is_null());
  validate_last_report(true);
  const double fp = ppl(j8, 0), p8 = ppl(j8, 1), p1 = ppl(j1, 1);
  std::printf("demo on Exodus (2048 tokens): fp32 %.4f, uniform 8 bpd %.4f, uniform 1 bpd %.4f\n", fp, p8, p1);
  EXPECT_EQ(j8["text_tokens"], 2048);
  EXPECT_EQ(j8["rows"][0]["tokens"], 2048) << "every token scored once";
  EXPECT_LT(std::fabs(p8 / fp - 1), 0.005) << "8 bits within 0.5% of fp32";
  EXPECT_GT(p1, fp * 1.02) << "1 bpd must cost perplexity";
  EXPECT_GT(p1, p8);
  EXPECT_DOUBLE_EQ(double(j1["rows"][0]["ppl"]), fp) << "the fp32 row does not depend on the allocation";
  // The baseline is uniform at the same nominal bpd: for a uniform allocation it is the same coder.
  EXPECT_DOUBLE_EQ(ppl(j1, 2), p1);
  EXPECT_EQ(j1["rows"][2]["k_bpd_nominal"], 1.0);
  EXPECT_GT(double(j1["rows"][1]["k_bpd_effective"]), 1.0) << "norms count";
}

// The end-to-end KL of the coded rows (kl_vs_fp32) orders the budgets, and gates CI: --max-kl and
// --max-ppl-ratio exit 1 with one line each when the allocation's row is above them, 0 otherwise;
// --no-kl leaves the field out.
TEST(EvalCli, EndToEndKlGatesCi) {
  REQUIRE_TEXTS();
  auto a8 = allocation("u8", "--method uniform --bpd 8");
  auto a1 = allocation("u1", "--method uniform --bpd 1");
  const std::string args = " --text " + g_exodus + " --calib " + cal() + " --baseline none --window 64 --stride 32 --max-tokens 256";
  json j8 = eval("--alloc " + a8 + args), j1 = eval("--alloc " + a1 + args);
  ASSERT_FALSE(j8.is_null());
  ASSERT_FALSE(j1.is_null());
  validate_last_report(false);
  const double k8 = j8["rows"][1]["kl_vs_fp32"], k1 = j1["rows"][1]["kl_vs_fp32"];
  std::printf("end-to-end KL: uniform 8 bpd %.3g, 1 bpd %.3g\n", k8, k1);
  EXPECT_GT(k1, 100 * k8);
  EXPECT_FALSE(j1["rows"][0].contains("kl_vs_fp32")) << "the fp32 row has no KL";
  auto gate = [&](const std::string& extra) {
    return test::run_cmd(test::bin("kvq-eval") + " -q --threads 2 --model " + kDemo + " --alloc " + a1 + args + extra);
  };
  auto r = gate(" --max-kl " + std::to_string(k1 / 2));
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("kvq-eval: gate failed: end-to-end KL"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(gate(" --max-kl " + std::to_string(k1 * 2)).status, 0);
  r = gate(" --max-ppl-ratio 1.0000001");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("gate failed: perplexity ratio"), std::string::npos) << r.err;
  json nk = eval("--alloc " + a1 + args + " --no-kl");
  ASSERT_FALSE(nk.is_null());
  EXPECT_FALSE(nk["rows"][1].contains("kl_vs_fp32"));
  EXPECT_DOUBLE_EQ(double(nk["rows"][1]["ppl"]), double(j1["rows"][1]["ppl"])) << "the KL pass changes nothing else";
}

TEST(EvalCli, ProtectedTokensHelpAndBlockGtqRuns) {
  REQUIRE_TEXTS();
  auto bg = allocation("bg2", "--method block-gtq --bpd 2");
  const std::string base = "--alloc " + bg + " --text " + g_exodus + " --window 96 --stride 48 --max-tokens 768";
  json plain = eval(base);
  json prot = eval(base + " --sink 4 --recent 24");
  ASSERT_FALSE(plain.is_null());
  ASSERT_FALSE(prot.is_null());
  EXPECT_EQ(plain["rows"][1]["name"], "block-gtq/uniform");
  EXPECT_EQ(prot["sink"], 4);
  EXPECT_EQ(prot["recent"], 24);
  for (size_t row : {1, 2}) {
    std::printf("%s: PPL %.4f plain, %.4f with --sink 4 --recent 24 (fp32 %.4f)\n",
                std::string(plain["rows"][row]["name"]).c_str(), ppl(plain, row), ppl(prot, row), ppl(plain, 0));
    EXPECT_LT(ppl(prot, row), ppl(plain, row)) << "full-precision sink and recent tokens must help";
    EXPECT_LT(std::fabs(ppl(prot, row) - ppl(plain, 0)), std::fabs(ppl(plain, row) - ppl(plain, 0)));
    // One forward per window either way.
    EXPECT_EQ(prot["rows"][row]["forward_tokens"], plain["rows"][row]["forward_tokens"]);
  }
  EXPECT_EQ(ppl(prot, 0), ppl(plain, 0));
}

TEST(EvalCli, HeldOutTextNeverOverlapsCalibration) {
  REQUIRE_TEXTS();
  auto a = allocation("u4", "--method uniform --bpd 4");
  CalibFile c = read_calib(cal(), true);
  auto tok = Tokenizer::load(kDemo + "/tokenizer.model");
  // Text cut from the calibration corpus: one of its calibration windows, and its held-out windows.
  // Windows are BOS + 127 tokens of the corpus stream; decode the stream tokens back to text.
  auto window_text = [&](const int64_t* ids, int n) {
    std::vector<int> v(ids + 1, ids + n);
    return tok->decode(v);
  };
  std::string heldout;
  for (int w = 0; w < c.holdout.windows; ++w)
    heldout += window_text(&c.holdout.ids[size_t(w) * c.prov.seq_len], c.prov.seq_len) + "\n";
  auto heldout_txt = test::temp_path("heldout.txt");
  test::write_text(heldout_txt, heldout);
  // One calibration window's middle 100 tokens, from the calibration stream as calib-capture cut it.
  std::vector<int32_t> stream = calibration_stream(c, cal());
  const int64_t off = c.calib_offsets[5];
  auto inside = test::temp_path("inside.txt");
  test::write_text(inside, tok->decode(std::vector<int>(stream.begin() + off + 10, stream.begin() + off + 110)));
  const std::string common = " --alloc " + a + " --calib " + cal() + kFast;
  test::CmdResult r;

  // 1. Exodus is disjoint from Genesis: accepted, and the report says what was checked.
  json ok = eval("--text " + g_exodus + common);
  ASSERT_FALSE(ok.is_null());
  EXPECT_NE(std::string(ok["held_out_check"]).find("16 calibration windows"), std::string::npos) << ok["held_out_check"];

  // 2. The calibration file's own held-out windows are held out: accepted.
  eval("--text " + heldout_txt + common, &r);
  EXPECT_EQ(r.status, 0) << r.err;

  // 3. The calibration corpus itself: refused, one line, no report written.
  auto out = test::temp_path("never.json");
  fs::remove(out);
  r = test::run_cmd(test::bin("kvq-eval") + " -q --model " + kDemo + " --text " + g_genesis + common + " --json " + out);
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("not held out"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(fs::exists(out));

  // 4. Without --calib the check runs against the calibration file the allocation names...
  r = test::run_cmd(test::bin("kvq-eval") + " -q --model " + kDemo + " --alloc " + a + " --text " + g_genesis + kFast);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("not held out"), std::string::npos) << r.err;
  // ... and says so loudly when that file is gone.
  fs::rename(cal(), cal() + ".away");
  json unchecked = eval("--alloc " + a + " --text " + g_exodus + kFast);
  fs::rename(cal() + ".away", cal());
  ASSERT_FALSE(unchecked.is_null());
  EXPECT_NE(std::string(unchecked["held_out_check"]).find("NOT CHECKED"), std::string::npos);

  // 5. A piece of one calibration window, pasted into other text: refused, naming the window.
  auto mixed = test::temp_path("mixed.txt");
  {
    std::ifstream f(g_exodus);
    std::stringstream ss;
    ss << f.rdbuf();
    std::string ex = ss.str();
    std::ifstream g(inside);
    std::stringstream piece;
    piece << g.rdbuf();
    test::write_text(mixed, ex.substr(0, 3000) + "\n" + piece.str() + "\n" + ex.substr(3000, 3000));
  }
  r = test::run_cmd(test::bin("kvq-eval") + " -q --model " + kDemo + " --text " + mixed + common);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("calibration window 5 "), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST(EvalCli, BadInputsAreOneLineErrors) {
  REQUIRE_TEXTS();
  auto a = allocation("u4", "--method uniform --bpd 4");
  auto frac = allocation("dp15", "--method cobra-dp --bpd 1.5");
  // Another model of the same shape: the demo with another RoPE base (a different config sha256).
  auto other = test::temp_path("other-model");
  fs::create_directories(other);
  for (const char* f : {"model.safetensors", "tokenizer.model"}) fs::copy_file(kDemo + "/" + f, other + "/" + f, fs::copy_options::overwrite_existing);
  {
    std::ifstream in(kDemo + "/config.json");
    json cfg = json::parse(in);
    cfg["rope_theta"] = 20000.0;
    std::ofstream(other + "/config.json") << cfg.dump(2);
  }
  auto other_cal = test::temp_path("other.kvqcal.h5");
  ASSERT_EQ(test::run_cmd(test::bin("calib-capture") + " -q --threads 1 --model " + other + " --corpus " + g_genesis +
                          " --samples 4 --seq-len 64 --holdout 0 --out " + other_cal)
                .status,
            0);
  auto empty = test::temp_path("empty.txt"), bad_utf8 = test::temp_path("bad.txt");
  test::write_text(empty, "\n\n");
  test::write_text(bad_utf8, "In the beginning \xff\xfe God");
  const std::string M = " --model " + kDemo, T = " --text " + g_exodus;
  struct Case {
    std::string args, expect;
  };
  std::vector<Case> cases = {
      {" --model " + other + " --alloc " + a + T, "the allocation was made for another model"},
      {M + " --alloc " + a + " --calib " + other_cal + T, "does not match"},
      {M + " --alloc " + a + " --text /nonexistent/held-out.txt", "no such file"},
      {M + " --alloc /nonexistent.kvqalloc.h5" + T, "/nonexistent.kvqalloc.h5"},
      {M + " --alloc " + a + " --calib /nonexistent.kvqcal.h5" + T, "/nonexistent.kvqcal.h5"},
      {" --model /nonexistent-model --alloc " + a + T, "/nonexistent-model"},
      {M + " --alloc " + a + T + " --window 100000", "--window"},
      {M + " --alloc " + a + T + " --window 128 --stride 128", "--stride"},
      {M + " --alloc " + a + T + " --sink -1", "--sink"},
      {M + " --alloc " + a + T + " --recent x", "--recent"},
      {M + " --alloc " + a + T + " --baseline kivi", "--baseline"},
      {M + " --alloc " + frac + T, "--baseline-k-bpd"},
      {M + " --alloc " + a + " --text " + empty, "holds no tokens"},
      {M + " --alloc " + a + " --text " + bad_utf8, "invalid byte at offset 17"},
      {M + T, "--alloc"},
  };
  for (const auto& c : cases) {
    auto out = test::temp_path("never.json");
    fs::remove(out);
    auto r = test::run_cmd(test::bin("kvq-eval") + " -q" + c.args + " --max-tokens 256 --json " + out);
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.args << " -> " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.args << " -> " << r.err;
    EXPECT_FALSE(fs::exists(out)) << c.args;
  }
  // A fractional allocation runs without a baseline, or with one at explicit whole bits.
  json j = eval("--alloc " + frac + T + " --baseline none --max-tokens 256 --window 128 --stride 64");
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["rows"].size(), 2u);
  validate_last_report(false);
  j = eval("--alloc " + frac + T + " --baseline-k-bpd 2 --baseline-v-bpd 2 --max-tokens 256 --window 128 --stride 64");
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["rows"].size(), 3u);
  EXPECT_EQ(j["rows"][2]["k_bpd_nominal"], 2.0);
}

namespace {
// Effective bpd from the packed-layout rules (schemas/packed-layout.md), written here: a block is
// [records][codes][pad to 2 bytes]; TQ: one fp16 norm per group, or with compact group norms one
// 16-bit record; low rank: one fp16 norm.
long align2(long bytes) { return (bytes + 1) / 2 * 2; }
double layout_bpd(const HeadDecision& h, int d) {
  long code_bits = 0, records = 0;
  if (h.kind == CodingKind::kTqGroups) {
    for (const auto& g : h.groups) code_bits += long(g.dims.size()) * g.bits;
    records = h.ratio_bits > 0 ? 1 : long(h.groups.size());
  } else if (h.kind == CodingKind::kLowRankHadamard) {
    code_bits = long(h.rank) * h.bits, records = 1;
  } else {
    ADD_FAILURE() << "no layout rule written for this kind in the test";
  }
  return double(align2(2 * records + (code_bits + 7) / 8)) * 8 / d;
}
// Of the whole bits 1..8 whose uniform (one group, one norm) effective bpd reaches target, those
// with the smallest effective bpd, the widest of them (every pair compared).
int brute_force_uniform_bits(double target, int d, double* eff) {
  int best = 0;
  for (int b = 1; b <= 8; ++b) {
    const double e = double(align2(2 + (long(d) * b + 7) / 8)) * 8 / d;
    if (e < target - 1e-9) continue;
    if (best == 0 || e < *eff - 1e-9 || (std::fabs(e - *eff) <= 1e-9 && b > best)) best = b, *eff = e;
  }
  return best;
}
}  // namespace

// --match effective: the uniform baseline's bits per side are the brute-force smallest-bytes widest whole bits
// whose effective bpd reaches the allocation's; the report says so (eval_version 2, schema-valid).
TEST(EvalCli, MatchEffectiveBaselineBudget) {
  REQUIRE_TEXTS();
  const int d = 64;  // the demo model's head_dim
  for (const std::string args : {"--method block-gtq --bpd 3", "--method cobra-dp --bpd 1.5"}) {
    const auto path = allocation(args == "--method block-gtq --bpd 3" ? "bg3" : "dp15", args);
    const AllocFile a = read_alloc(path);
    double ak = 0, av = 0, nk = 0, nv = 0;
    for (const auto& h : a.heads) (h.side == Side::kK ? ak : av) += layout_bpd(h, d), ++(h.side == Side::kK ? nk : nv);
    ak /= nk, av /= nv;
    double ek = 0, ev = 0;
    const int bk = brute_force_uniform_bits(ak, d, &ek), bv = brute_force_uniform_bits(av, d, &ev);
    ASSERT_GT(bk, 0);
    ASSERT_GT(bv, 0);
    json j = eval("--alloc " + path + " --text " + g_exodus + " --calib " + cal() +
                  " --match effective --max-tokens 256 --window 128 --stride 64");
    ASSERT_FALSE(j.is_null()) << args;
    validate_last_report(false);
    std::printf("demo %s --match effective: K %.4f eff -> uniform %d bits (%.4f), V %.4f eff -> %d bits (%.4f)\n",
                args.c_str(), ak, bk, ek, av, bv, ev);
    EXPECT_EQ(j["baseline_budget"], "effective");
    EXPECT_EQ(j["eval_version"], 2);
    ASSERT_EQ(j["rows"].size(), 3u);
    EXPECT_NEAR(double(j["rows"][1]["k_bpd_effective"]), ak, 1e-9);
    EXPECT_NEAR(double(j["rows"][1]["v_bpd_effective"]), av, 1e-9);
    EXPECT_EQ(double(j["rows"][2]["k_bpd_nominal"]), bk);
    EXPECT_EQ(double(j["rows"][2]["v_bpd_nominal"]), bv);
    EXPECT_NEAR(double(j["rows"][2]["k_bpd_effective"]), ek, 1e-9);
    EXPECT_NEAR(double(j["rows"][2]["v_bpd_effective"]), ev, 1e-9);
  }
  // The default stays nominal: version 1, the allocation's nominal bits.
  json n = eval("--alloc " + allocation("bg3", "--method block-gtq --bpd 3") + " --text " + g_exodus +
                " --max-tokens 256 --window 128 --stride 64");
  ASSERT_FALSE(n.is_null());
  EXPECT_EQ(n["baseline_budget"], "nominal");
  EXPECT_EQ(n["eval_version"], 1);
  EXPECT_EQ(n["rows"][2]["k_bpd_nominal"], 3.0);
  validate_last_report(false);
  // Explicit baseline bits or no baseline with --match effective: one-line usage errors, exit 2.
  const auto bg3 = allocation("bg3", "--method block-gtq --bpd 3");
  for (const std::string extra : {" --baseline-k-bpd 3", " --baseline-v-bpd 2", " --baseline none"}) {
    auto out = test::temp_path("never.json");
    fs::remove(out);
    auto r = test::run_cmd(test::bin("kvq-eval") + " -q --model " + kDemo + " --alloc " + bg3 + " --text " + g_exodus +
                           " --match effective" + extra + " --max-tokens 256 --json " + out);
    EXPECT_EQ(r.status, 2) << extra;
    EXPECT_NE(r.err.find("--match"), std::string::npos) << extra << " -> " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(out));
  }
}

// --load stream (the checkpoint mapped, one fp32 layer at a time per window) computes what the
// whole-model load computes: every row's perplexity bit for bit, with --sink/--recent too.
TEST(EvalCli, StreamedLoadGivesTheSameFigures) {
  REQUIRE_TEXTS();
  auto a = allocation("bg3", "--method block-gtq --bpd 3");
  const std::string args = "--alloc " + a + " --text " + g_exodus + " --calib " + cal() + kFast + " --sink 4 --recent 32";
  json w = eval(args), s = eval(args + " --load stream");
  ASSERT_FALSE(w.is_null());
  ASSERT_FALSE(s.is_null());
  ASSERT_EQ(w["rows"].size(), s["rows"].size());
  for (size_t i = 0; i < w["rows"].size(); ++i) {
    EXPECT_EQ(double(w["rows"][i]["ppl"]), double(s["rows"][i]["ppl"])) << "row " << i;
    EXPECT_EQ(w["rows"][i]["tokens"], s["rows"][i]["tokens"]);
  }
}

// --precision bf16 (issue 37): both forwards in BF16, recorded in the report (which still
// validates); the unquantized row's perplexity moves by a BF16-sized amount only (< 1 %), and the
// allocation's cost over it (the ratio) stays within 1 % of the fp32 forward's.
TEST(EvalCli, Bf16ForwardIsRecordedAndCloseToFp32) {
  REQUIRE_TEXTS();
  auto a2 = allocation("bg2", "--method block-gtq --bpd 2");
  const std::string args = "--alloc " + a2 + " --text " + g_exodus + " --calib " + cal() + kFast;
  json f = eval(args + " --precision fp32");
  json b = eval(args + " --precision bf16");
  ASSERT_FALSE(f.is_null());
  ASSERT_FALSE(b.is_null());
  validate_last_report(false);
  EXPECT_FALSE(f.contains("forward_precision"));
  EXPECT_EQ(b["forward_precision"], "bf16");
  const double r32 = ppl(f, 1) / ppl(f, 0), r16 = ppl(b, 1) / ppl(b, 0);
  std::printf("demo on Exodus: unquantized ppl fp32 %.4f bf16 %.4f; block-gtq 2 bpd ratio fp32 %.4f bf16 %.4f\n",
              ppl(f, 0), ppl(b, 0), r32, r16);
  EXPECT_NE(ppl(f, 0), ppl(b, 0)) << "BF16 is not in effect";
  EXPECT_LT(std::fabs(ppl(b, 0) / ppl(f, 0) - 1), 0.01);
  EXPECT_LT(std::fabs(r16 / r32 - 1), 0.01);
}
