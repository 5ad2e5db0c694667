// kvq-allocate --group-norms compact (the default) on the shared models, end to end: Block-GTQ's
// effective bits equal uniform TQ-MSE's at the same nominal bits (issue 14's goal: within 0.1 bpd
// at d >= 64; here exactly, and at d = 8 too); the held-out RoPE-logit MAE kvq-verify measures
// stays within 6 % of fp16 group norms on every layer; at equal effective bits (kvq-verify --match
// effective) Block-GTQ beats uniform on every layer of the demo model at K2 and K3 and of
// stories260K at K2; the file is the same for any
// --threads; kvq-inspect says what the side information is.
#include <gtest/gtest.h>

#include <cstdio>
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

json verify_json(const std::string& cal, const std::string& alloc, const std::string& extra) {
  const std::string out = alloc + ".me.json";
  fs::remove(out);
  auto r = run_cmd(bin("kvq-verify") + " -q --calib " + cal + " --alloc " + alloc + " --json " + out + " " + extra);
  EXPECT_EQ(r.status, 0) << r.err;
  return fs::exists(out) ? json::parse(std::ifstream(out)) : json::object();
}

// wins_at_k3: whether Block-GTQ's wins at equal effective bits are asserted at K3 too. At d = 8
// (stories260K) uniform 3 and 4 bits both pad to 6 bytes per token, so the matched baseline is
// uniform K4 in the same bytes and beats Block-GTQ K3 there (printed).
void check_model(const std::string& cal, const std::string& model, bool wins_at_k3) {
  for (int b : {2, 3}) {
    SCOPED_TRACE(model + " K" + std::to_string(b));
    const std::string bits = " --bpd " + std::to_string(b);
    const std::string uni = allocate(cal, "--method uniform" + bits, "gnc_uni");
    const std::string cmp = allocate(cal, "--method block-gtq" + bits, "gnc_cmp");
    const std::string f16 = allocate(cal, "--method block-gtq --group-norms fp16" + bits, "gnc_f16");
    const kvq::AllocFile au = kvq::read_alloc(uni), ac = kvq::read_alloc(cmp), af = kvq::read_alloc(f16);
    EXPECT_EQ(ac.params.value("group_norms", std::string()), "compact");
    EXPECT_EQ(ac.k_bpd_effective, au.k_bpd_effective);
    EXPECT_GT(af.k_bpd_effective, au.k_bpd_effective + 0.5) << "fp16 norms: one per group";
    int compact_heads = 0;
    for (const auto& h : ac.heads) compact_heads += h.ratio_bits == 8;
    EXPECT_GT(compact_heads, 0);

    const std::vector<double> mc = layer_mae(cal, cmp), mf = layer_mae(cal, f16), mu = layer_mae(cal, uni);
    ASSERT_EQ(mc.size(), mf.size());
    ASSERT_EQ(mc.size(), mu.size());
    for (size_t l = 0; l < mc.size(); ++l) {
      std::printf("NOTE %s K%d L%zu MAE uniform %.4f (%.4f bpd) | block-gtq fp16 norms %.4f (%.4f bpd) | compact %.4f "
                  "(%.4f bpd)\n",
                  model.c_str(), b, l, mu[l], au.k_bpd_effective, mf[l], af.k_bpd_effective, mc[l], ac.k_bpd_effective);
      EXPECT_LE(mc[l], 1.06 * mf[l]) << "layer " << l;
    }
    // Equal effective bits: the baseline is uniform at the same bits (its bpd is the same).
    const json v = verify_json(cal, cmp, "--match effective");
    ASSERT_TRUE(v.contains("layer_wins"));
    EXPECT_EQ(v["baseline"]["k_bpd_effective"].get<double>(), ac.k_bpd_effective);
    if (b == 2 || wins_at_k3) EXPECT_EQ(v["layer_wins"].get<int>(), v["n_layers"].get<int>());
    std::printf("NOTE %s K%d equal effective bits: Block-GTQ wins %d/%d layers against uniform K%g\n", model.c_str(),
                b, v["layer_wins"].get<int>(), v["n_layers"].get<int>(), v["baseline"]["k_bpd_nominal"].get<double>());
  }
}

}  // namespace

TEST(GroupNormsCompact, DemoModel) {
  const std::string cal = demo_cal("gnc");
  if (cal.empty()) GTEST_SKIP() << "needs `bible` (Debian bible-kjv)";
  check_model(cal, "kvq-demo-llama", true);
}

TEST(GroupNormsCompact, Stories260K) {
  KVQ_REQUIRE_SHARED("models/stories260K/stories260K.bin");
  check_model(stories_cal("gnc"), "stories260K", false);
}

TEST(GroupNormsCompact, SameFileForAnyThreadCountAndInspectSaysSo) {
  const std::string cal = demo_cal("gnc");
  if (cal.empty()) GTEST_SKIP() << "needs `bible` (Debian bible-kjv)";
  const std::string a1 = allocate(cal, "--method block-gtq --bpd 3 --threads 1", "gnc_t1");
  const std::string a2 = allocate(cal, "--method block-gtq --bpd 3 --threads 2", "gnc_t2");
  EXPECT_EQ(bytes_of(a1), bytes_of(a2));
  const std::string txt = temp_path("gnc_inspect.txt");
  auto r = run_cmd(bin("kvq-inspect") + " " + a1 + " > " + txt);
  ASSERT_EQ(r.status, 0) << r.err;
  std::string out = bytes_of(txt);
  EXPECT_NE(out.find("kvq-allocation v4"), std::string::npos) << out;
  EXPECT_NE(out.find("group norms  compact on 8 of 8 multi-group TQ heads"), std::string::npos) << out;
  // --group-norms fp16 writes what the previous default wrote: no compact field, a version <= 3 file.
  const std::string f = allocate(cal, "--method block-gtq --bpd 3 --group-norms fp16", "gnc_f16b");
  EXPECT_LE(kvq::alloc_version_for(kvq::read_alloc(f)), 3);
  r = run_cmd(bin("kvq-inspect") + " " + f + " > " + txt);
  out = bytes_of(txt);
  EXPECT_NE(out.find("group norms  fp16 per group on 8 TQ heads"), std::string::npos) << out;
  // The manifest validates against the schema (python3-jsonschema); a broken record must not.
  if (run_cmd("python3 -c 'import jsonschema'").status == 0) {
    const std::string man = temp_path("gnc_manifest.json"), broken = temp_path("gnc_manifest_bad.json");
    ASSERT_EQ(run_cmd(bin("kvq-allocate") + " -q --calib " + cal + " --method block-gtq --bpd 3 --out " +
                      temp_path("gnc_m.kvqalloc.h5") + " --manifest " + man)
                  .status,
              0);
    json m = json::parse(std::ifstream(man));
    ASSERT_EQ(m["version"], 4);
    const std::string check =
        "python3 -c 'import json,sys,jsonschema; s=json.load(open(sys.argv[2])); "
        "jsonschema.Draft202012Validator.check_schema(s); jsonschema.validate(json.load(open(sys.argv[1])), s)' ";
    const std::string schema = std::string(KVQ_SOURCE_DIR) + "/schemas/allocation-manifest.schema.json";
    auto v = run_cmd(check + man + " " + schema);
    EXPECT_EQ(v.status, 0) << v.err;
    for (auto& h : m["heads"])
      if (h.contains("group_norms")) h["group_norms"]["ratio_bits"] = 9;
    kvq::test::write_text(broken, m.dump());
    EXPECT_NE(run_cmd(check + broken + " " + schema).status, 0) << "the schema must reject ratio_bits 9";
  } else {
    std::printf("python3-jsonschema missing: manifest schema not checked (scripts/test installs it)\n");
  }
  // A bad --ratio-bits is a usage error, no file.
  const std::string bad = temp_path("gnc_bad.kvqalloc.h5");
  fs::remove(bad);
  r = run_cmd(bin("kvq-allocate") + " -q --calib " + cal + " --method block-gtq --bpd 3 --ratio-bits 9 --out " + bad);
  EXPECT_EQ(r.status, 2);
  EXPECT_FALSE(fs::exists(bad));
}
