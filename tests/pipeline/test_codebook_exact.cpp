// kvq-allocate --codebook exact (TqGroup::codebook = kSphere, allocation version 3
// groups[].codebook = "exact"): what the file records, that files without it keep their bytes,
// the round trip through the reader and writer, version-1 and version-2 files (refused when they
// name a codebook: a v2 reader would decode the exact tables as Gaussian), bad values
// (one line naming the file and the field), the flag's refusals, effective bpd unchanged, and
// kvq-verify's per-layer RoPE-logit MAE gaussian -> exact for uniform and Block-GTQ at K2 / K3 on
// the demo model and stories260K (printed; asserted only where measured to hold, see below).
#include <gtest/gtest.h>

#include <H5Cpp.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>

#include "kvq/io/alloc_file.hpp"
#include "kvq/io/h5.hpp"
#include "kvq/util/error.hpp"
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

struct Verify {
  std::vector<double> mae;
  double k_eff = 0;
};

Verify verify(const std::string& cal, const std::string& alloc) {
  auto out = temp_path("cbx_verify.json");
  fs::remove(out);
  auto r = run_cmd(bin("kvq-verify") + " -q --calib " + cal + " --alloc " + alloc + " --json " + out);
  EXPECT_EQ(r.status, 0) << r.err;
  Verify v;
  if (!fs::exists(out)) return v;
  const json j = json::parse(std::ifstream(out));
  for (const auto& l : j["allocation"]["layers"]) v.mae.push_back(l["logit_mae"].get<double>());
  v.k_eff = kvq::read_alloc(alloc).k_bpd_effective;
  return v;
}

void rewrite(const std::string& p, int64_t version, const std::function<void(json&)>& edit) {
  kvq::h5::quiet();
  H5::H5File f(p, H5F_ACC_RDWR);
  H5::Group g = f.openGroup("/");
  json m = json::parse(kvq::h5::read_attr_str(p, g, "manifest"));
  edit(m);
  g.removeAttr("manifest");
  kvq::h5::write_attr(g, "manifest", m.dump());
  g.removeAttr("version");
  kvq::h5::write_attr(g, "version", version);
}

// Per layer gaussian -> exact; returns the exact/gaussian ratio of the mean. check(method, b)
// says where "exact never raises a layer's MAE" is asserted.
void mae_table(const std::string& cal, const std::string& model,
               const std::function<bool(const std::string&, int)>& check) {
  for (const char* method : {"uniform", "block-gtq"})
    for (int b : {2, 3}) {
      const std::string args = std::string("--method ") + method + " --bpd " + std::to_string(b);
      const Verify g = verify(cal, allocate(cal, args, "cbx_g"));
      const Verify x = verify(cal, allocate(cal, args + " --codebook exact", "cbx_x"));
      const Verify xd = verify(cal, allocate(cal, args + " --codebook exact --exact-distortion", "cbx_xd"));
      ASSERT_EQ(g.mae.size(), x.mae.size());
      ASSERT_EQ(g.mae.size(), xd.mae.size());
      ASSERT_FALSE(g.mae.empty());
      // The codebook costs no bits: same layout, same effective bpd.
      EXPECT_EQ(g.k_eff, x.k_eff) << model << " " << method << " K" << b;
      const bool asserted = check(method, b);
      std::printf("%s %s K%d (eff %.4f bpd; exact+exact-distortion eff %.4f) per-layer logit MAE gaussian -> exact "
                  "[-> exact --exact-distortion]:",
                  model.c_str(), method, b, g.k_eff, xd.k_eff);
      double sg = 0, sx = 0, sxd = 0;
      for (size_t l = 0; l < g.mae.size(); ++l) {
        std::printf(" L%zu %.5f->%.5f [%.5f]", l, g.mae[l], x.mae[l], xd.mae[l]);
        sg += g.mae[l], sx += x.mae[l], sxd += xd.mae[l];
        if (asserted) {
          EXPECT_LE(x.mae[l], g.mae[l]) << model << " " << method << " K" << b << " layer " << l;
        }
      }
      const double n = double(g.mae.size());
      std::printf(" | mean %.5f->%.5f (%+.1f%%) [%.5f (%+.1f%%)]%s\n", sg / n, sx / n, 100 * (sx / sg - 1), sxd / n,
                  100 * (sxd / sg - 1), asserted ? "" : " (not asserted)");
    }
}

}  // namespace

TEST(CodebookExact, FileRecordsItAndOtherFilesKeepTheirBytes) {
  const std::string cal = demo_cal("cbx");
  if (cal.empty()) GTEST_SKIP() << "needs `bible` (Debian bible-kjv)";
  const std::string def = allocate(cal, "--method block-gtq --bpd 3", "cbx_def");
  const std::string gau = allocate(cal, "--method block-gtq --bpd 3 --codebook gaussian", "cbx_gau");
  const std::string ex = allocate(cal, "--method block-gtq --bpd 3 --codebook exact", "cbx_ex");
  EXPECT_EQ(bytes_of(def), bytes_of(gau)) << "--codebook gaussian must write what the default writes";
  const kvq::AllocFile d = kvq::read_alloc(def), x = kvq::read_alloc(ex);
  const json md = kvq::alloc_manifest(d), mx = kvq::alloc_manifest(x);
  EXPECT_EQ(md.dump().find("\"codebook\""), std::string::npos);
  EXPECT_EQ(mx["params"]["codebook"], "exact");
  EXPECT_EQ(mx["version"], 4);  // the default compact group norms; version 3 with fp16 ones:
  EXPECT_EQ(kvq::alloc_version_for(kvq::read_alloc(
                allocate(cal, "--method block-gtq --bpd 3 --codebook exact --group-norms fp16", "cbx_ex16"))),
            3);
  ASSERT_EQ(d.heads.size(), x.heads.size());
  size_t n_exact = 0;
  for (size_t i = 0; i < x.heads.size(); ++i) {
    const auto& hx = x.heads[i];
    ASSERT_EQ(hx.kind, kvq::CodingKind::kTqGroups);  // K block-gtq, V uniform
    ASSERT_EQ(hx.groups.size(), d.heads[i].groups.size());
    for (size_t g = 0; g < hx.groups.size(); ++g) {
      const auto& gx = hx.groups[g];
      const auto& gd = d.heads[i].groups[g];
      EXPECT_EQ(gd.codebook, kvq::TqCodebook::kGaussian);
      // Same groups, bits and seeds (without --exact-distortion the codebook does not move bits).
      EXPECT_EQ(gx.dims, gd.dims);
      EXPECT_EQ(gx.bits, gd.bits);
      EXPECT_EQ(gx.rotation_seed, gd.rotation_seed);
      const bool fits = gx.dims.size() >= 2 && gx.dims.size() <= size_t(kvq::kTqSphereMaxM);
      EXPECT_EQ(gx.codebook, fits ? kvq::TqCodebook::kSphere : kvq::TqCodebook::kGaussian);
      n_exact += gx.codebook == kvq::TqCodebook::kSphere;
      const json& jg = mx["heads"][i]["groups"][g];
      EXPECT_EQ(jg.contains("codebook"), gx.codebook == kvq::TqCodebook::kSphere);
      if (jg.contains("codebook")) {
        EXPECT_EQ(jg["codebook"], "exact");
      }
    }
  }
  EXPECT_GT(n_exact, 0u);
  EXPECT_EQ(d.k_bpd_effective, x.k_bpd_effective);
  EXPECT_EQ(d.v_bpd_effective, x.v_bpd_effective);
  // Round trip: what the reader gives the writer writes the same bytes.
  for (const std::string& p : {def, ex}) {
    const auto again = temp_path("cbx_again.kvqalloc.h5");
    fs::remove(again);
    kvq::write_alloc(again, kvq::read_alloc(p));
    EXPECT_EQ(bytes_of(again), bytes_of(p)) << p;
  }
  // kvq-inspect shows it with the other parameters.
  const auto txt = temp_path("cbx_inspect.txt");
  auto r = run_cmd(bin("kvq-inspect") + " " + ex + " > " + txt);
  EXPECT_EQ(r.status, 0) << r.err;
  const std::string shown = bytes_of(txt);
  EXPECT_NE(shown.find("codebook=exact"), std::string::npos) << shown;
}

TEST(CodebookExact, OldFilesReadAsGaussianAndBadValuesAreOneLine) {
  const std::string gold = std::string(KVQ_SOURCE_DIR) + "/data/golden/";
  for (const char* f : {"block-gtq-v1.kvqalloc.h5", "block-gtq-v2.kvqalloc.h5", "cobra-dp-v1.kvqalloc.h5"})
    for (const auto& h : kvq::read_alloc(gold + f).heads)
      for (const auto& g : h.groups) EXPECT_EQ(g.codebook, kvq::TqCodebook::kGaussian) << f;
  struct Case {
    const char* name;
    const char* src;
    int64_t version;
    std::function<void(json&)> edit;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"in_v1", "block-gtq-v1.kvqalloc.h5", 1, [](json& m) { m["heads"][0]["groups"][0]["codebook"] = "exact"; },
       "manifest.heads[0].groups[].codebook: needs allocation version >= 3, the file is version 1"},
      {"in_v2", "block-gtq-v2.kvqalloc.h5", 2, [](json& m) { m["heads"][0]["groups"][0]["codebook"] = "exact"; },
       "manifest.heads[0].groups[].codebook: needs allocation version >= 3, the file is version 2"},
      {"gaussian_in_v2", "block-gtq-v2.kvqalloc.h5", 2, [](json& m) { m["heads"][0]["groups"][0]["codebook"] = "gaussian"; },
       "manifest.heads[0].groups[].codebook: needs allocation version >= 3, the file is version 2"},
      {"unknown", "block-gtq-v2.kvqalloc.h5", 3, [](json& m) { m["heads"][0]["groups"][0]["codebook"] = "lattice"; },
       "manifest.heads[0].groups[].codebook: unknown codebook 'lattice' (valid: gaussian, exact)"},
      {"not_string", "block-gtq-v2.kvqalloc.h5", 3, [](json& m) { m["heads"][0]["groups"][0]["codebook"] = 1; },
       "manifest.heads[0].groups[].codebook: unknown codebook '1' (valid: gaussian, exact)"},
      {"too_big", "block-gtq-v2.kvqalloc.h5", 3,
       [](json& m) {
         m["heads"][0]["groups"][0]["codebook"] = "exact";
         m["heads"][0]["groups"][0]["dims"] = std::vector<int>(65, 0);
       },
       "manifest.heads[0].groups[].codebook: exact needs 2..64 dims, the group has 65"},
  };
  for (const Case& c : cases) {
    const auto p = temp_path(std::string("cbx_bad_") + c.name + ".kvqalloc.h5");
    fs::remove(p);
    fs::copy_file(gold + c.src, p);
    rewrite(p, c.version, c.edit);
    std::string err;
    try {
      kvq::read_alloc(p);
    } catch (const kvq::Error& e) {
      err = e.what();
    }
    EXPECT_NE(err.find(p), std::string::npos) << c.name << ": " << err;
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.name << ": " << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << c.name;
  }
  // An explicit "gaussian" in a version-3 file reads as the default.
  const auto p = temp_path("cbx_explicit_gaussian.kvqalloc.h5");
  fs::remove(p);
  fs::copy_file(gold + "block-gtq-v2.kvqalloc.h5", p);
  rewrite(p, 3, [](json& m) { m["heads"][0]["groups"][0]["codebook"] = "gaussian"; });
  EXPECT_EQ(kvq::read_alloc(p).heads[0].groups[0].codebook, kvq::TqCodebook::kGaussian);
}

TEST(CodebookExact, FlagRefusals) {
  const std::string cal = demo_cal("cbx");
  if (cal.empty()) GTEST_SKIP() << "needs `bible` (Debian bible-kjv)";
  const auto out = temp_path("cbx_refused.kvqalloc.h5");
  auto bad = run_cmd(bin("kvq-allocate") + " -q --calib " + cal + " --out " + out + " --codebook lattice");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("--codebook"), std::string::npos) << bad.err;
  auto cobra = run_cmd(bin("kvq-allocate") + " -q --calib " + cal + " --out " + out +
                       " --method cobra-mse --v-method cobra-mse --bpd 3 --codebook exact");
  EXPECT_NE(cobra.status, 0);
  EXPECT_NE(cobra.err.find("--codebook"), std::string::npos) << cobra.err;
  EXPECT_NE(cobra.err.find("TQ groups"), std::string::npos) << cobra.err;
  size_t lines = 0;
  for (char ch : cobra.err) lines += ch == '\n';
  EXPECT_LE(lines, 1u) << cobra.err;
  // K cobra with the default V (uniform TQ): applies to V only.
  const auto mixed = kvq::read_alloc(allocate(cal, "--method cobra-mse --bpd 3 --codebook exact", "cbx_mixed"));
  for (const auto& h : mixed.heads)
    for (const auto& g : h.groups) EXPECT_EQ(g.codebook, kvq::TqCodebook::kSphere);  // V d = 64
}

// Measured (16 x 128 calibrations, 2 held-out windows; table in the run's output): Block-GTQ
// K3 lowers every layer on both models (demo -5.4% mean, stories260K -27.6%), Block-GTQ K2 every
// layer of the demo model (-2.4%) and the mean on stories260K (-9.4%; L3 +3.6%); uniform TQ is
// mixed (demo K2 +0.0%, K3 -0.3% with single layers up; stories260K K2 +1.3%, K3 -12.3%): the
// unit-vector MSE falls for every (m, b) (test_sphere_codebook_coded), but keys rotated by one
// Haar matrix are not uniformly spread on the sphere, and the logit error is not the MSE.
// Asserted: Block-GTQ K3 per layer on both models.
TEST(CodebookExact, LayerLogitMaeDemo) {
  const std::string cal = demo_cal("cbx");
  if (cal.empty()) GTEST_SKIP() << "needs `bible` (Debian bible-kjv)";
  mae_table(cal, "kvq-demo-llama", [](const std::string& m, int b) { return m == "block-gtq" && b == 3; });
}

TEST(CodebookExact, LayerLogitMaeStories) {
  KVQ_REQUIRE_SHARED("models/stories260K/stories260K.bin");
  mae_table(stories_cal("cbx"), "stories260K", [](const std::string& m, int b) { return m == "block-gtq" && b == 3; });
}

// What an identity-rotation group (--rotate-below 3) should code with: kvq-allocate gives the
// exact codebook to every group of 2..64 dims whatever its rotation; the alternative, exact on
// Haar groups only, is made here by dropping the field from the unrotated groups. Printed only
// (the measurement behind the rule): the mean MAE is lower with every group exact in all four
// rows (demo K2 0.38655 vs 0.38660, K3 0.19739 vs 0.19767; stories260K K2 3.65956 vs 3.68175, K3
// 1.72301 vs 1.73568), single layers either way; gaussian is above both everywhere but one layer
// (stories260K K2 L3).
TEST(CodebookExact, UnrotatedGroupsPrinted) {
  const std::string demo = demo_cal("cbx");
  if (demo.empty()) GTEST_SKIP() << "needs `bible` (Debian bible-kjv)";
  std::vector<std::pair<std::string, std::string>> cals = {{"kvq-demo-llama", demo}};
  if (fs::exists(kvq::test::shared_path("models/stories260K/stories260K.bin"))) cals.push_back({"stories260K", stories_cal("cbx")});
  for (const auto& [model, cal] : cals)
    for (int b : {2, 3}) {
      const std::string args = "--method block-gtq --rotate-below 3 --bpd " + std::to_string(b);
      const Verify g = verify(cal, allocate(cal, args, "cbx_rb_g"));
      const std::string all = allocate(cal, args + " --codebook exact", "cbx_rb_x");
      const Verify x = verify(cal, all);
      const auto haar_only = temp_path("cbx_rb_haar.kvqalloc.h5");
      fs::remove(haar_only);
      fs::copy_file(all, haar_only);
      rewrite(haar_only, kvq::alloc_version_for(kvq::read_alloc(all)), [](json& m) {
        for (auto& h : m["heads"])
          if (h.contains("groups"))
            for (auto& gr : h["groups"])
              if (gr.value("rotation", std::string("haar")) == "identity") gr.erase("codebook");
      });
      const Verify xh = verify(cal, haar_only);
      ASSERT_EQ(g.mae.size(), x.mae.size());
      ASSERT_EQ(g.mae.size(), xh.mae.size());
      double sg = 0, sx = 0, sh = 0;
      std::printf("%s block-gtq K%d --rotate-below 3, per-layer logit MAE gaussian / exact all groups / exact Haar "
                  "groups only:",
                  model.c_str(), b);
      for (size_t l = 0; l < g.mae.size(); ++l) {
        std::printf(" L%zu %.5f/%.5f/%.5f", l, g.mae[l], x.mae[l], xh.mae[l]);
        sg += g.mae[l], sx += x.mae[l], sh += xh.mae[l];
      }
      std::printf(" | mean %.5f/%.5f/%.5f\n", sg / g.mae.size(), sx / g.mae.size(), sh / g.mae.size());
    }
}
