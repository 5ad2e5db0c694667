// kvq-inspect as users run it, on calibration and allocation files of two real models
// (stories260K: llama2.c, interleaved RoPE, d = 8; the demo model: HF Llama, split-half, d = 64):
// every figure renders and is a real image, the JSON validates, the tables agree with the
// decisions, the before-C2 distortions the allocation stores are the ones recomputed from the
// calibration (and their spread the solver's), older files without them still show them, and bad
// input is one line.
#include <gtest/gtest.h>

#include <cairo.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "kvq/io/alloc_file.hpp"
#include "kvq/io/h5.hpp"
#include "kvq/io/h5_paths.hpp"
#include "kvq/report/inspect.hpp"
#include "kvq/report/plots.hpp"
#include "kvq/report/summary.hpp"
#include "run_cmd.hpp"
#include "shared_data.hpp"

using namespace kvq;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string g_stories_cal, g_demo_cal;

std::string capture(const std::string& model, const std::string& corpus, const std::string& out) {
  auto r = test::run_cmd("SOURCE_DATE_EPOCH=1 " + test::bin("calib-capture") + " -q --threads 1 --model " + model +
                         " --corpus " + corpus + " --samples 12 --seq-len 96 --holdout 1 --reservoir-tokens 256 --out " +
                         out);
  EXPECT_EQ(r.status, 0) << r.err;
  return r.status == 0 ? out : "";
}

std::string stories_cal() {
  if (g_stories_cal.empty())
    g_stories_cal = capture(test::shared_path("models/stories260K/stories260K.bin"),
                            test::shared_path("corpora/wikitext2-train-sample.txt"), test::temp_path("stories.kvqcal.h5"));
  return g_stories_cal;
}

// The demo model calibrates in domain on Genesis from Debian's bible-kjv.
std::string demo_cal() {
  if (g_demo_cal.empty()) {
    auto text = test::temp_path("genesis.txt");
    if (test::run_cmd("bible -p /usr/lib gen1:1-gen50:26 > " + text).status != 0) return "";
    g_demo_cal = capture(std::string(KVQ_SOURCE_DIR) + "/data/kvq-demo-llama", text, test::temp_path("demo.kvqcal.h5"));
  }
  return g_demo_cal;
}

#define REQUIRE_DEMO_CAL()                                                     \
  std::string cal = demo_cal();                                                \
  if (cal.empty()) GTEST_SKIP() << "needs `bible` (Debian bible-kjv) for in-domain text"

#define REQUIRE_STORIES_CAL()                                  \
  KVQ_REQUIRE_SHARED("models/stories260K/stories260K.bin");    \
  std::string scal = stories_cal();                            \
  ASSERT_FALSE(scal.empty())

std::string allocate(const std::string& cal, const std::string& name, const std::string& args) {
  const std::string out = test::temp_path(name + ".kvqalloc.h5");
  auto r = test::run_cmd(test::bin("kvq-allocate") + " -q --calib " + cal + " --out " + out + " " + args);
  EXPECT_EQ(r.status, 0) << args << ": " << r.err;
  return out;
}

struct Run {
  int status;
  std::string out, err;
};
Run inspect(const std::string& args) {
  const std::string so = test::temp_path("inspect_stdout.txt");
  auto r = test::run_cmd(test::bin("kvq-inspect") + " " + args + " > " + so);
  std::ifstream f(so);
  std::stringstream ss;
  ss << f.rdbuf();
  return {r.status, ss.str(), r.err};
}

std::string fresh_dir(const std::string& name) {
  const std::string d = test::temp_path(name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Decodes the PNG with cairo's own reader and checks it is a real figure: the expected size,
// several colours, a good part of it drawn (not blank white).
void expect_png(const std::string& path, kvq::report::PlotSize size, size_t min_colours = 6) {
  SCOPED_TRACE(path);
  ASSERT_TRUE(fs::exists(path));
  cairo_surface_t* s = cairo_image_surface_create_from_png(path.c_str());
  ASSERT_EQ(cairo_surface_status(s), CAIRO_STATUS_SUCCESS) << cairo_status_to_string(cairo_surface_status(s));
  const int w = cairo_image_surface_get_width(s), h = cairo_image_surface_get_height(s);
  EXPECT_EQ(w, size.width);
  EXPECT_EQ(h, size.height);
  cairo_surface_flush(s);
  const unsigned char* data = cairo_image_surface_get_data(s);
  const int stride = cairo_image_surface_get_stride(s);
  std::set<uint32_t> colours;
  size_t non_white = 0;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      uint32_t px;
      std::memcpy(&px, data + size_t(y) * size_t(stride) + size_t(x) * 4, 4);
      colours.insert(px & 0xffffffu);
      non_white += (px & 0xffffffu) != 0xffffffu;
    }
  cairo_surface_destroy(s);
  EXPECT_GE(colours.size(), min_colours) << "too few colours: a trivial image";
  EXPECT_GT(double(non_white) / (double(w) * h), 0.02) << "almost blank";
}

void expect_svg(const std::string& path) {
  SCOPED_TRACE(path);
  ASSERT_TRUE(fs::exists(path));
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string s = ss.str();
  EXPECT_EQ(s.rfind("<?xml", 0), 0u);
  EXPECT_NE(s.find("<svg"), std::string::npos);
  EXPECT_NE(s.find("</svg>"), std::string::npos);
  EXPECT_GT(s.size(), 2000u);
  // Well-formed XML, when a parser is at hand.
  if (test::run_cmd("python3 -c 'import xml.etree.ElementTree'").status == 0) {
    auto r = test::run_cmd("python3 -c 'import sys,xml.etree.ElementTree as E; "
                           "r=E.parse(sys.argv[1]).getroot(); sys.exit(r.tag != \"{http://www.w3.org/2000/svg}svg\")' " +
                           path);
    EXPECT_EQ(r.status, 0) << r.err;
  }
}

void expect_figure(const std::string& stem, kvq::report::PlotSize size, size_t min_colours = 6) {
  expect_png(stem + ".png", size, min_colours);
  expect_svg(stem + ".svg");
}

// Figures are named <input file stem>.<figure>: "x/kvq_7_bg2.kvqalloc.h5" -> "<dir>/kvq_7_bg2.<figure>".
std::string stem_of(const std::string& input) {
  std::string b = fs::path(input).filename().string();
  for (const std::string ext : {".kvqalloc.h5", ".kvqcal.h5"})
    if (b.size() > ext.size() && b.compare(b.size() - ext.size(), ext.size(), ext) == 0) b.resize(b.size() - ext.size());
  return b;
}
std::string fig(const std::string& dir, const std::string& input, const std::string& figure) {
  return dir + "/" + stem_of(input) + "." + figure;
}

bool have_jsonschema() { return test::run_cmd("python3 -c 'import jsonschema'").status == 0; }
int validate(const std::string& json_path, const std::string& schema_name, std::string* err = nullptr) {
  const std::string check = "python3 -c 'import json,sys,jsonschema; jsonschema.validate(json.load(open(sys.argv[1])), "
                            "json.load(open(sys.argv[2])))' ";
  auto r = test::run_cmd(check + json_path + " " + std::string(KVQ_SOURCE_DIR) + "/schemas/" + schema_name);
  if (err) *err = r.err;
  return r.status;
}

int count_lines(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  int n = 0;
  while (std::getline(f, line)) ++n;
  return n;
}

}  // namespace

// ---------------------------------------------------------------- figures

TEST(Inspect, CalibrationFiguresAndSummary) {
  REQUIRE_DEMO_CAL();
  const std::string dir = fresh_dir("figs_cal");
  auto r = inspect(cal + " --plots " + dir + " --layer 1 --head 1");
  ASSERT_EQ(r.status, 0) << r.err;
  expect_figure(fig(dir, cal, "energy_l1_h1"), report::kEnergySize);
  expect_figure(fig(dir, cal, "eigen_l1_h1"), report::kEigenSize);
  for (const char* s : {"kvq-calibration v3", "maxima       |x| per head recorded", "kvq-demo-llama", "split-half", "corpus", "held out", "reservoir",
                        "tokens", "max/median", "per layer"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

TEST(Inspect, BlockGtqFigures) {
  REQUIRE_DEMO_CAL();
  const std::string a = allocate(cal, "bg2", "--method block-gtq --bpd 2");
  const std::string dir = fresh_dir("figs_bg");
  auto r = inspect(a + " --plots " + dir + " --layer 2 --head 1");
  ASSERT_EQ(r.status, 0) << r.err;
  expect_figure(fig(dir, a, "fingerprint"), report::kFingerprintSize, 8);
  expect_figure(fig(dir, a, "energy_l2_h1"), report::kEnergySize, 8);
  expect_figure(fig(dir, a, "eigen_l2_h1"), report::kEigenSize);
  EXPECT_FALSE(fs::exists(fig(dir, a, "cobra_heads.png"))) << "no low-rank heads";
  EXPECT_NE(r.err.find("(rank, bits) figure skipped"), std::string::npos) << r.err;
  // Version 3: --norm-correction auto (the default) decided per head, not all the same.
  for (const char* s : {"kvq-allocation v4", "group norms  compact", "block-gtq", "nominal", "effective", "allocator fingerprint, K",
                        "allocator fingerprint, V", "per head:", "block_bits"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

TEST(Inspect, CobraFiguresAndBeforeC2Spread) {
  REQUIRE_DEMO_CAL();
  const std::string dir = fresh_dir("figs_cobra");
  const std::string a = allocate(cal, "cobra2", "--method cobra-mse --v-method cobra-mse --bpd 2");
  auto r = inspect(a + " --plots " + dir + " --layer 3 --head 0");
  ASSERT_EQ(r.status, 0) << r.err;
  expect_figure(fig(dir, a, "fingerprint"), report::kFingerprintSize, 8);
  expect_figure(fig(dir, a, "cobra_heads"), report::kCobraSize, 8);
  expect_figure(fig(dir, a, "eigen_l3_h0"), report::kEigenSize);
  expect_figure(fig(dir, a, "energy_l3_h0"), report::kEnergySize);
  EXPECT_NE(r.out.find("after C2"), std::string::npos) << r.out;

  EXPECT_NE(r.out.find("distortion before C2 (stored by the solver)"), std::string::npos) << r.out;

  // The before-C2 figures the allocation stores equal the ones recomputed from the calibration,
  // and their spread is the one the solver recorded, for every COBRA flavour with a model curve.
  const CalibFile c = read_calib(cal, false);
  for (std::string args : {"--method cobra-mse --v-method cobra-mse --bpd 2", "--method cobra-kl --bpd 1.5",
                           "--method cobra-dp --v-method cobra-dp --bpd 3", "--method cobra-dp --bpd 2 --joint-kv",
                           "--method cobra-mse --bpd 2 --uncentered --c1-rounding round"}) {
    SCOPED_TRACE(args);
    const AllocFile al = read_alloc(allocate(cal, "c2check", args));
    const bool joint = al.summary.contains("joint");
    std::vector<double> before_kv, after_kv;  // joint K/V: one spread over K and V heads together
    for (Side side : {Side::kK, Side::kV}) {
      const auto before = report::cobra_distortion_before(al, c, side);
      const auto after = report::cobra_distortion_after(al, side);
      const std::optional<Method> m = report::side_method(al, side);
      ASSERT_TRUE(m.has_value());
      if (!is_cobra(*m)) {
        EXPECT_TRUE(before.empty());
        EXPECT_TRUE(al.distortion_before(side).empty());
        EXPECT_TRUE(report::distortion_before_c2(al, &c, side).empty());
        continue;
      }
      ASSERT_EQ(before.size(), size_t(c.prov.n_layers * c.prov.n_kv_heads));
      const std::vector<double>& stored = al.distortion_before(side);
      ASSERT_EQ(stored.size(), before.size());
      for (size_t i = 0; i < before.size(); ++i)
        EXPECT_NEAR(stored[i], before[i], 1e-12 * std::max(1.0, std::abs(before[i]))) << "head " << i;
      EXPECT_EQ(report::distortion_before_c2(al, nullptr, side), stored) << "the stored ones are shown";
      before_kv.insert(before_kv.end(), before.begin(), before.end());
      after_kv.insert(after_kv.end(), after.begin(), after.end());
      if (joint) continue;
      const json& s = al.summary[side == Side::kK ? "k" : "v"];
      const double want = s["distortion_std_before"];
      EXPECT_NEAR(kvq::population_std(before), want, 1e-9 * std::max(1.0, want));
      EXPECT_NEAR(kvq::population_std(after), double(s["distortion_std_after"]), 1e-9 * std::max(1.0, want));
    }
    if (joint) {
      const double want = al.summary["joint"]["distortion_std_before"];
      EXPECT_NEAR(kvq::population_std(before_kv), want, 1e-9 * std::max(1.0, want));
      EXPECT_NEAR(kvq::population_std(after_kv), double(al.summary["joint"]["distortion_std_after"]),
                  1e-9 * std::max(1.0, want));
    }
  }
}

TEST(Inspect, CobraMeasuredBeforeCurveIsStoredNotRecomputed) {
  REQUIRE_DEMO_CAL();
  const std::string a = allocate(cal, "meas", "--method cobra-measured --bpd 2 --measure-tokens 128");
  const std::string dir = fresh_dir("figs_meas");
  auto r = inspect(a + " --plots " + dir);
  ASSERT_EQ(r.status, 0) << r.err;
  expect_figure(fig(dir, a, "cobra_heads"), report::kCobraSize, 6);
  // Measured curves cannot be recomputed from the statistics; the solver's own are stored.
  const AllocFile al = read_alloc(a);
  EXPECT_TRUE(report::cobra_distortion_before(al, read_calib(cal, false), Side::kK).empty());
  const auto& stored = al.distortion_before(Side::kK);
  ASSERT_EQ(stored.size(), size_t(al.calib.n_layers * al.calib.n_kv_heads));
  const double want = al.summary["k"]["distortion_std_before"];
  EXPECT_NEAR(kvq::population_std(stored), want, 1e-9 * std::max(1.0, want));
  EXPECT_TRUE(al.v_distortion_before.empty()) << "V is uniform";
}

// Allocation files written before kvq stored the before-C2 distortions: recomputed with a
// calibration, reported missing without one.
TEST(Inspect, OlderAllocationWithoutStoredBeforeC2) {
  // The golden cobra-dp file is such a file.
  const std::string golden = std::string(KVQ_SOURCE_DIR) + "/data/golden/";
  const std::string g = golden + "cobra-dp-v1.kvqalloc.h5", gcal = golden + "calib-v1.kvqcal.h5";
  const AllocFile gl = read_alloc(g);
  ASSERT_TRUE(gl.k_distortion_before.empty());
  const CalibFile gc = read_calib(gcal, false);
  EXPECT_FALSE(report::distortion_before_c2(gl, &gc, Side::kK).empty());
  EXPECT_EQ(report::distortion_before_c2(gl, &gc, Side::kK), report::cobra_distortion_before(gl, gc, Side::kK));
  EXPECT_TRUE(report::distortion_before_c2(gl, nullptr, Side::kK).empty());
  auto r = inspect(g + " --calib " + gcal);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("K per-head distortion before C2 (recomputed from calib-v1.kvqcal.h5)"), std::string::npos)
      << r.out;

  // A new file, and the same file without its /solver group, made from a calibration that is then
  // gone: the new one still shows them, the old one says they were skipped.
  REQUIRE_DEMO_CAL();
  const std::string gone = test::temp_path("gone.kvqcal.h5");
  fs::copy_file(cal, gone, fs::copy_options::overwrite_existing);
  const std::string n = allocate(gone, "stored_dp", "--method cobra-dp --bpd 2");
  fs::remove(gone);
  const std::string old = test::temp_path("old_dp.kvqalloc.h5");
  fs::copy_file(n, old, fs::copy_options::overwrite_existing);
  {
    H5::H5File f(old, H5F_ACC_RDWR);
    ASSERT_GE(H5Ldelete(f.getId(), h5path::kSolver, H5P_DEFAULT), 0);
  }
  ASSERT_TRUE(read_alloc(old).k_distortion_before.empty());

  r = inspect(n);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("K per-head distortion before C2 (stored by the solver)"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("energy and eigenvalue figures skipped"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("before-C2"), std::string::npos) << r.err;

  r = inspect(old);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.find("distortion before C2"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("and before-C2 distortions skipped"), std::string::npos) << r.err;
  const std::string dir = fresh_dir("figs_old");
  ASSERT_EQ(inspect(old + " -q --plots " + dir).status, 0);
  expect_figure(fig(dir, old, "cobra_heads"), report::kCobraSize, 6);

  r = inspect(old + " --calib " + cal);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("K per-head distortion before C2 (recomputed from " + fs::path(cal).filename().string() + ")"),
            std::string::npos)
      << r.out;
  const CalibFile c = read_calib(cal, false);
  EXPECT_EQ(report::distortion_before_c2(read_alloc(old), &c, Side::kK).size(), read_alloc(n).k_distortion_before.size());
}

TEST(Inspect, StoriesInterleavedSmallHeads) {
  REQUIRE_STORIES_CAL();
  const std::string dir = fresh_dir("figs_stories");
  const std::string bg = allocate(scal, "s_bg", "--method block-gtq --bpd 3");
  const std::string co = allocate(scal, "s_dp", "--method cobra-dp --v-method cobra-dp --bpd 2");
  ASSERT_EQ(inspect(scal + " --plots " + dir + " --layer 4 --head 3").status, 0);
  expect_figure(fig(dir, scal, "energy_l4_h3"), report::kEnergySize);
  expect_figure(fig(dir, scal, "eigen_l4_h3"), report::kEigenSize);
  auto r = inspect(bg + " --plots " + dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("interleaved"), std::string::npos);
  expect_figure(fig(dir, bg, "fingerprint"), report::kFingerprintSize, 8);
  expect_figure(fig(dir, bg, "energy_l0_h0"), report::kEnergySize);
  ASSERT_EQ(inspect(co + " --plots " + dir).status, 0);
  expect_figure(fig(dir, co, "cobra_heads"), report::kCobraSize);
}

// ---------------------------------------------------------------- data

TEST(Inspect, FingerprintAgreesWithDecisions) {
  REQUIRE_DEMO_CAL();
  for (std::string m : {"block-gtq", "uniform", "cobra-dp"}) {
    SCOPED_TRACE(m);
    const AllocFile a = read_alloc(allocate(cal, "fp_" + m, "--method " + m + " --bpd 2"));
    const int d = a.calib.head_dim, H = a.calib.n_kv_heads;
    const auto f = report::fingerprint(a, Side::kK);
    ASSERT_EQ(f.dims.size(), size_t(a.calib.n_layers));
    double mean = 0;
    for (int l = 0; l < a.calib.n_layers; ++l) {
      double share = 0;
      for (int w = 0; w <= f.max_width; ++w) share += f.share(l, w);
      EXPECT_NEAR(share, 1.0, 1e-12);
      int64_t code = 0;
      for (const auto& h : a.heads)
        if (h.side == Side::kK && h.layer == l) code += report::code_bits(h, d);
      EXPECT_NEAR(f.mean_bits(l) * d * H, double(code), 1e-9) << "layer " << l;
      mean += f.mean_bits(l) / a.calib.n_layers;
    }
    EXPECT_NEAR(mean, double(a.summary["k"]["code_bits_per_dim"]), 1e-9);
    if (m == "block-gtq") {
      // The per-block widths read back from the groups are the solver's block_bits.
      for (const auto& h : a.heads)
        if (h.side == Side::kK) {
          EXPECT_EQ(report::block_widths(h, a.calib), h.block_bits);
        }
    }
  }
}

TEST(Inspect, JsonValidatesAgainstSchemas) {
  REQUIRE_DEMO_CAL();
  if (!have_jsonschema()) GTEST_SKIP() << "needs python3-jsonschema (scripts/test installs it)";
  const std::string bg = allocate(cal, "j_bg", "--method block-gtq --bpd 2");
  const std::string cm = allocate(cal, "j_cm", "--method cobra-mse --v-method cobra-mse --bpd 2");
  std::string err;
  for (const auto& a : {bg, cm}) {
    const std::string j = test::temp_path("alloc.json");
    ASSERT_EQ(inspect(a + " -q --json " + j).status, 0);
    EXPECT_EQ(validate(j, "allocation-manifest.schema.json", &err), 0) << a << ": " << err;
    // It is the allocation's manifest, the one kvq-allocate --manifest writes.
    EXPECT_EQ(json::parse(std::ifstream(j)), alloc_manifest(read_alloc(a)));
  }
  const std::string jc = test::temp_path("cal.json"), jx = test::temp_path("cmp.json");
  ASSERT_EQ(inspect(cal + " -q --json " + jc).status, 0);
  EXPECT_EQ(validate(jc, "inspect-summary.schema.json", &err), 0) << err;
  ASSERT_EQ(inspect(bg + " " + cm + " -q --json " + jx).status, 0);
  EXPECT_EQ(validate(jx, "inspect-summary.schema.json", &err), 0) << err;
  json c = json::parse(std::ifstream(jc));
  EXPECT_EQ(c["kind"], "calibration");
  EXPECT_EQ(c["heads"].size(), size_t(c["provenance"]["n_layers"]) * size_t(c["provenance"]["n_kv_heads"]));
  // The validator is real: a summary with a bad field fails it.
  c["heads"][0]["top_quarter_share"] = 2.0;
  std::ofstream(test::temp_path("bad.json")) << c.dump();
  EXPECT_NE(validate(test::temp_path("bad.json"), "inspect-summary.schema.json"), 0);
}

TEST(Inspect, CsvTables) {
  REQUIRE_DEMO_CAL();
  const std::string a = allocate(cal, "csv_bg", "--method block-gtq --bpd 3");
  const std::string out = test::temp_path("t.csv");
  ASSERT_EQ(inspect(a + " -q --csv " + out).status, 0);
  const AllocFile al = read_alloc(a);
  EXPECT_EQ(count_lines(out), 1 + int(al.heads.size()));
  const std::string fp = report::csv_path(out, "fingerprint");
  EXPECT_EQ(fp, test::temp_path("t.fingerprint.csv"));
  EXPECT_EQ(count_lines(fp), 1 + 2 * al.calib.n_layers);
  std::ifstream f(out);
  std::string header;
  std::getline(f, header);
  EXPECT_EQ(header, "side,layer,kv_head,kind,rank,bits,budget_bits,code_bits,eff_bpd,pred_D,pred_D_before_C2,block_bits");

  const std::string cc = test::temp_path("c.csv");
  ASSERT_EQ(inspect(cal + " -q --csv " + cc).status, 0);
  const int heads = al.calib.n_layers * al.calib.n_kv_heads;
  EXPECT_EQ(count_lines(cc), 1 + heads);
  EXPECT_EQ(count_lines(report::csv_path(cc, "blocks")), 1 + heads * al.calib.head_dim / 2);
}

// ---------------------------------------------------------------- comparison

TEST(Inspect, CompareTwoAllocations) {
  REQUIRE_DEMO_CAL();
  const std::string u = allocate(cal, "cmp_u", "--method uniform --bpd 2");
  const std::string b = allocate(cal, "cmp_bg", "--method block-gtq --bpd 2");
  const std::string c = allocate(cal, "cmp_dp", "--method cobra-dp --bpd 2");
  const std::string dir = fresh_dir("figs_cmp");
  auto r = inspect(u + " " + b + " --plots " + dir);
  ASSERT_EQ(r.status, 0) << r.err;
  expect_figure(dir + "/" + stem_of(u) + "_vs_" + stem_of(b) + ".compare", report::kCompareSize);
  EXPECT_NE(r.out.find("gained"), std::string::npos) << r.out;

  const auto cmp = report::compare_allocs(read_alloc(u), u, read_alloc(b), b);
  int moved = 0;
  for (const auto& m : cmp.layers) {
    if (m.side != Side::kK) continue;
    // Same budget: Block-GTQ only moves bits between the blocks of a head.
    EXPECT_EQ(m.bits_a, m.bits_b) << "layer " << m.layer;
    EXPECT_EQ(m.gained, m.lost) << "layer " << m.layer;
    EXPECT_TRUE(m.per_dim);
    moved += int(m.gained);
  }
  EXPECT_GT(moved, 0) << "Block-GTQ moved no bits relative to uniform";
  // Against a low-rank allocation the comparison is per head, never per coordinate.
  for (const auto& m : report::compare_allocs(read_alloc(b), b, read_alloc(c), c).layers)
    if (m.side == Side::kK) {
      EXPECT_FALSE(m.per_dim);
    }
}

// ---------------------------------------------------------------- bad input

TEST(Inspect, RefusesAllocationsOfDifferentModels) {
  REQUIRE_DEMO_CAL();
  REQUIRE_STORIES_CAL();
  const std::string a = allocate(cal, "dm_a", "--method block-gtq --bpd 2");
  const std::string b = allocate(scal, "dm_b", "--method block-gtq --bpd 2");
  auto r = inspect(a + " " + b);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("model_config_sha256"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("different models"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
  // --calib of another model is refused too, naming the field.
  auto r2 = inspect(a + " --calib " + scal);
  EXPECT_EQ(r2.status, 2);
  EXPECT_NE(r2.err.find("calibration."), std::string::npos) << r2.err;
}

TEST(Inspect, BadInputsAreOneLine) {
  REQUIRE_DEMO_CAL();
  const std::string a = allocate(cal, "bad_a", "--method block-gtq --bpd 2");
  const std::string txt = test::temp_path("not_h5.txt");
  test::write_text(txt, "hello, not an HDF5 file\n");
  const std::string other = test::temp_path("other.h5");
  {
    h5::quiet();
    auto f = h5::create(other);
    H5::Group root = f.openGroup("/");
    h5::write_attr(root, "format", std::string("something-else"));
  }
  const std::string nofmt = test::temp_path("nofmt.h5");
  { h5::create(nofmt); }
  struct Case {
    std::string args, expect;
  };
  const std::vector<Case> cases = {
      {txt, "not_h5.txt"},
      {other, "found 'something-else'"},
      {nofmt, "@format"},
      {test::temp_path("missing.kvqalloc.h5"), "no such file"},
      {a + " " + cal, "comparing needs two allocation files"},
      {cal + " " + a, "comparing needs two allocation files"},
      {a + " --calib " + a, "not a calibration file"},
      {cal + " --calib " + cal, "--calib"},
      {a + " --plots " + test::temp_path("p_bad") + " --layer 99", "--layer"},
      {cal + " --plots " + test::temp_path("p_bad") + " --head 7", "--head"},
      {a + " --layer -1", "--layer"},
      {"", "FILE"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    auto r = inspect(c.args);
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
    EXPECT_EQ(r.err.find("terminate"), std::string::npos);
  }
  // A failed figure leaves no half file behind, nor (issue 27: a failed run leaves no partial output)
  // the --plots directory the run created.
  EXPECT_FALSE(fs::exists(test::temp_path("p_bad")));
}
