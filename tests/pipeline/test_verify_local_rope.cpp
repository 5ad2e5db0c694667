// kvq-verify on Gemma 3, whose sliding-window ("local") layers rotate with the default RoPE at
// rope_local_base_freq while its full ("global") layers use rope_theta with the checkpoint's linear
// scaling: calib-capture records the local RoPE (rope_local_inv_freq, rope_local_attention_factor,
// rope_local_layers) in a version-7 file, checked against config.json; kvq-verify's held-out logit
// MAE, KL, top-10 and output error equal a brute force written here that rotates q and k with the
// layer's own RoPE (its own rotation code, split-half pairs (i, i + d/2), the file's positions) under
// the window mask and the recorded scale; the same with the global RoPE on every layer disagrees on
// the local layers (negative control: Block-GTQ codes K post-RoPE, so the rotation moves the coding
// error). Also: bad local RoPE fields (length, non-positive frequency or factor, layer index, in a version-6
// file) are refused in one line naming the field, merging files of different local RoPE is refused,
// and kvq-inspect prints a "local rope" line.
#include <gtest/gtest.h>

#include <H5Cpp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>

#include "kvq/capture/capture.hpp"
#include "kvq/codec/codec.hpp"
#include "kvq/io/alloc_file.hpp"
#include "kvq/io/calib_file.hpp"
#include "kvq/io/h5.hpp"
#include "kvq/pipeline/verify.hpp"
#include "kvq/util/error.hpp"
#include "h5_root.hpp"
#include "run_cmd.hpp"
#include "tiny_family_files.hpp"
#include "bad_provenance.hpp"
#include "verify_brute.hpp"

namespace fs = std::filesystem;
using namespace kvq;
using kvq::test::bin;
using kvq::test::run_cmd;
using kvq::test::temp_path;
using kvq::test::slurp;
using kvq::test::expect_same;
using kvq::test::verify_cpu;

namespace {

// kvq-make-tiny-hf --family gemma3: 7 layers (0-4 and 6 sliding over 16 tokens, 5 full), 4 query
// heads over 2 KV heads, head_dim 32, query_pre_attn_scalar 48, local RoPE 1e4, global 1e6 with
// linear x8, inside the multimodal wrapper (text fields under text_config).
constexpr int kLayers = 7;
constexpr int kSeqLen = 48;  // > the window, so the sliding layers' queries lose keys to it

test::TinyFiles make_files() { return test::make_tiny_files("verify_local_rope", "gemma3", kSeqLen, "block-gtq", 2); }


// The checkpoint's text config (text_config for the multimodal wrapper).
nlohmann::json text_config(const std::string& model) {
  const auto cfg = nlohmann::json::parse(slurp(model + "/config.json"));
  return cfg.contains("text_config") ? cfg["text_config"] : cfg;
}

// The sliding layers as transformers reads them: layer_types, else the default rule (sliding unless
// (i + 1) % sliding_window_pattern == 0, the pattern 6 by default).
std::vector<int> sliding_layers(const nlohmann::json& tc) {
  const int n = tc.at("num_hidden_layers").get<int>();
  std::vector<int> out;
  for (int i = 0; i < n; ++i) {
    const bool sliding = tc.contains("layer_types") ? tc["layer_types"][size_t(i)] == "sliding_attention"
                                                    : (i + 1) % tc.value("sliding_window_pattern", 6) != 0;
    if (sliding) out.push_back(i);
  }
  return out;
}

// The RoPE a brute force applies: inverse frequencies and the cos/sin factor.
struct Rope {
  std::vector<double> inv_freq;
  double factor = 1.0;
};

// Split-half RoPE written here: pair (i, i + d/2) turns by pos · inv_freq[i], in double, rounded to
// float as the rows are stored.
void rotate(float* x, int d, int64_t pos, const Rope& r) {
  const int half = d / 2;
  for (int i = 0; i < half; ++i) {
    const double ang = double(pos) * r.inv_freq[size_t(i)];
    const double c = r.factor * std::cos(ang), s = r.factor * std::sin(ang);
    const double a = x[i], b = x[i + half];
    x[i] = float(a * c - b * s);
    x[i + half] = float(a * s + b * c);
  }
}

Rope local_of(const CalibProvenance& p) { return {p.rope_local_inv_freq, p.rope_local_attention_factor}; }
Rope global_of(const CalibProvenance& p) { return {p.rope_inv_freq, p.rope_attention_factor}; }

// One layer's figures by brute force (verify_brute.hpp) with `rope` rotated by rotate() above, under
// the layer's window and the recorded scale.
Metrics brute_force(const CalibFile& c, const AllocFile& a, int layer, const Rope& rope) {
  test::BruteOptions o;
  o.window = c.prov.window_of(layer);
  o.rotate = [rope](float* x, int d, int64_t pos) { rotate(x, d, pos, rope); };
  return test::verify_brute_force(c, a, layer, o);
}

constexpr double kMaeTol = test::kBruteMaeTol, kKlTol = test::kBruteKlTol;



}  // namespace

TEST(VerifyLocalRope, CaptureRecordsTheLocalRope) {
  const test::TinyFiles f = make_files();
  const CalibFile c = read_calib(f.cal, false);
  const auto& p = c.prov;
  EXPECT_EQ(c.format_version, 7);
  EXPECT_EQ(kvq::test::read_root_text_raw(f.cal, "provenance").version, 7);
  ASSERT_EQ(p.n_layers, kLayers);
  ASSERT_EQ(p.pairing, RopePairing::kSplitHalf);
  ASSERT_EQ(p.rotary_dim, p.head_dim);
  ASSERT_TRUE(p.has_local_rope());

  const nlohmann::json tc = text_config(f.model);
  const int d = tc.at("head_dim").get<int>();
  ASSERT_EQ(p.head_dim, d);
  const std::vector<int> sliding = sliding_layers(tc);
  EXPECT_EQ(sliding, (std::vector<int>{0, 1, 2, 3, 4, 6}));  // the tiny checkpoint's layer_types
  EXPECT_EQ(p.rope_local_layers, sliding);
  for (int l = 0; l < kLayers; ++l) {
    const bool local = std::find(sliding.begin(), sliding.end(), l) != sliding.end();
    EXPECT_EQ(p.local_rope(l), local) << l;
    EXPECT_EQ(p.window_of(l), local ? tc.at("sliding_window").get<int>() : 0) << l;
  }

  // The frequencies from config.json: local base^(-2i/d), unscaled; global theta^(-2i/d) / factor.
  const double base = tc.at("rope_local_base_freq").get<double>(), theta = tc.at("rope_theta").get<double>();
  ASSERT_EQ(tc.at("rope_scaling").at("rope_type"), "linear");
  const double factor = tc.at("rope_scaling").at("factor").get<double>();
  ASSERT_EQ(p.rope_local_inv_freq.size(), size_t(d / 2));
  ASSERT_EQ(p.rope_inv_freq.size(), size_t(d / 2));
  double worst_local = 0, worst_global = 0;
  for (int i = 0; i < d / 2; ++i) {
    const double local = std::pow(base, -2.0 * i / d), global = std::pow(theta, -2.0 * i / d) / factor;
    EXPECT_NEAR(p.rope_local_inv_freq[size_t(i)], local, 1e-14 * local) << i;
    EXPECT_NEAR(p.rope_inv_freq[size_t(i)], global, 1e-14 * global) << i;
    worst_local = std::max(worst_local, std::fabs(p.rope_local_inv_freq[size_t(i)] - local) / local);
    worst_global = std::max(worst_global, std::fabs(p.rope_inv_freq[size_t(i)] - global) / global);
  }
  std::printf("recorded vs config.json inverse frequencies: max relative difference local %.3g, global %.3g\n",
              worst_local, worst_global);
  EXPECT_EQ(p.rope_local_attention_factor, 1.0);
  EXPECT_EQ(p.rope_attention_factor, 1.0);
  EXPECT_EQ(p.rope_type, "linear");
  EXPECT_EQ(p.rope_theta, theta);
  // The two RoPEs differ from the first non-trivial pair on.
  EXPECT_NE(p.rope_local_inv_freq[1], p.rope_inv_freq[1]);

  const std::string txt = temp_path("verify_local_rope_inspect.txt");
  const auto r = run_cmd(bin("kvq-inspect") + " " + f.cal + " > " + txt);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string out = slurp(txt);
  const size_t at = out.find("\n  local rope ");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string line = out.substr(at + 1, out.find('\n', at + 1) - at - 1);
  EXPECT_NE(line.find("layers 0 1 2 3 4 6 "), std::string::npos) << line;
  std::printf("kvq-inspect: %s\n", line.c_str());
}

TEST(VerifyLocalRope, MetricsUseTheLayersOwnRope) {
  const test::TinyFiles f = make_files();
  const CalibFile c = read_calib(f.cal, true);
  const AllocFile a = read_alloc(f.alloc);
  const auto& p = c.prov;
  ASSERT_TRUE(p.has_local_rope());
  ASSERT_EQ(p.v_dim(), p.head_dim);
  ASSERT_GT(p.seq_len, 2 * p.window_of(0));
  ASSERT_GT(p.softmax_scale, 0);  // query_pre_attn_scalar 48 != head_dim 32
  EXPECT_NEAR(p.softmax_scale, 1 / std::sqrt(48.0), 1e-15);
  // Every K head post-RoPE (the premise of the negative control).
  for (const auto& h : a.heads)
    if (h.side == Side::kK) {
      EXPECT_TRUE(h.post_rope) << "layer " << h.layer << " head " << h.kv_head;
    }

  const VerifyReport rep = verify_cpu(f.cal, f.alloc);
  ASSERT_EQ(rep.alloc.layers.size(), size_t(kLayers));
  for (int l = 0; l < kLayers; ++l) {
    const bool local = p.local_rope(l);
    const std::string what = "layer " + std::to_string(l) + (local ? " (local)" : " (global)");
    SCOPED_TRACE(what);
    const Metrics own = brute_force(c, a, l, local ? local_of(p) : global_of(p));
    const Metrics& got = rep.alloc.layers[size_t(l)];
    expect_same(got, own, "the layer's own RoPE");
    const double mae_rel = std::fabs(got.logit_mae - own.logit_mae) / own.logit_mae,
                 kl_rel = std::fabs(got.kl - own.kl) / own.kl;
    if (!local) {
      std::printf("%s: kvq-verify / brute force: logit MAE %.6g / %.6g (rel %.2g), KL %.6g / %.6g (rel %.2g), "
                  "top-10 %.6g / %.6g, output error %.6g / %.6g\n",
                  what.c_str(), got.logit_mae, own.logit_mae, mae_rel, got.kl, own.kl, kl_rel, got.top10, own.top10,
                  got.out_rel_err, own.out_rel_err);
      continue;
    }
    // Negative control: the global RoPE on a local layer.
    const Metrics wrong = brute_force(c, a, l, global_of(p));
    const double wrong_mae = std::fabs(got.logit_mae - wrong.logit_mae) / wrong.logit_mae,
                 wrong_kl = std::fabs(got.kl - wrong.kl) / wrong.kl;
    std::printf("%s: kvq-verify / brute force own RoPE / global RoPE: logit MAE %.6g / %.6g / %.6g (rel %.2g / %.2g), "
                "KL %.6g / %.6g / %.6g (rel %.2g / %.2g), top-10 %.6g / %.6g / %.6g, output error %.6g / %.6g / %.6g\n",
                what.c_str(), got.logit_mae, own.logit_mae, wrong.logit_mae, mae_rel, wrong_mae, got.kl, own.kl,
                wrong.kl, kl_rel, wrong_kl, got.top10, own.top10, wrong.top10, got.out_rel_err, own.out_rel_err,
                wrong.out_rel_err);
    // At least 100 times the tolerance of expect_same on the MAE, 10 times on the KL.
    EXPECT_GT(wrong_mae, 100 * kMaeTol);
    EXPECT_GT(wrong_kl, 10 * kKlTol);
  }
}

TEST(VerifyLocalRope, BadLocalRopeIsRefusedInOneLine) {
  const test::TinyFiles f = make_files();
  const CalibFile good = read_calib(f.cal, true);
  ASSERT_TRUE(good.prov.has_local_rope());
  const std::vector<test::BadProvenance> cases = {
      {"short", [](CalibProvenance& p) { p.rope_local_inv_freq.pop_back(); }, "provenance.rope_local_inv_freq",
       "15 frequencies, rope_inv_freq has 16"},
      {"long", [](CalibProvenance& p) { p.rope_local_inv_freq.push_back(1e-5); }, "provenance.rope_local_inv_freq",
       "17 frequencies, rope_inv_freq has 16"},
      {"zero", [](CalibProvenance& p) { p.rope_local_inv_freq[3] = 0.0; }, "provenance.rope_local_inv_freq",
       "not a positive number"},
      {"negative", [](CalibProvenance& p) { p.rope_local_inv_freq[0] = -1.0; }, "provenance.rope_local_inv_freq",
       "not a positive number"},
      {"factor", [](CalibProvenance& p) { p.rope_local_attention_factor = 0.0; }, "provenance.rope_local_attention_factor",
       "is not a positive number"},
      {"layer_n_layers", [](CalibProvenance& p) { p.rope_local_layers.push_back(kLayers); },
       "provenance.rope_local_layers", "layer 7 outside [0, 7)"},
      {"layer_minus_1", [](CalibProvenance& p) { p.rope_local_layers[0] = -1; }, "provenance.rope_local_layers",
       "layer -1 outside [0, 7)"},
  };
  // The tool: exit 2, one line naming the field.
  const test::ToolOnCalib verify = [&](const std::string& path) {
    return bin("kvq-verify") + " -q --calib " + path + " --alloc " + f.alloc + " --json " +
           temp_path("verify_local_rope_bad.json");
  };
  test::expect_bad_provenance_refused(good, "verify_local_rope_bad", cases, verify);
  // The keys in a file of version 6 (the provenance dataset as version 7 writes it).
  test::expect_keys_refused_below(good, "verify_local_rope", 7, "provenance.rope_local_inv_freq", verify);
}

TEST(VerifyLocalRope, MergeRefusesDifferentLocalRope) {
  const test::TinyFiles f = make_files();
  const CalibFile a = read_calib(f.cal, true);
  ASSERT_TRUE(a.prov.has_local_rope());
  const struct {
    const char* name;
    std::function<void(CalibProvenance&)> edit;
  } cases[] = {
      {"frequency", [](CalibProvenance& p) { p.rope_local_inv_freq[2] *= 1.5; }},
      {"factor", [](CalibProvenance& p) { p.rope_local_attention_factor = 1.25; }},
      {"layers", [](CalibProvenance& p) { p.rope_local_layers.pop_back(); }},
      {"none", [](CalibProvenance& p) {
         p.rope_local_inv_freq.clear();
         p.rope_local_layers.clear();
       }},
  };
  for (const auto& cs : cases) {
    SCOPED_TRACE(cs.name);
    CalibFile b = a;
    cs.edit(b.prov);
    const std::string bp = temp_path(std::string("verify_local_rope_other_") + cs.name + ".kvqcal.h5");
    write_calib(bp, b);
    try {
      merge_calib(a, "a.kvqcal.h5", read_calib(bp, true), "b.kvqcal.h5");
      ADD_FAILURE() << "merged files of different local RoPE";
    } catch (const Error& e) {
      // merge names the local RoPE and shows both values.
      EXPECT_NE(std::string(e.what()).find("provenance.rope_local_inv_freq"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("layers 0 1 2 3 4"), std::string::npos) << e.what();
    }
    // The CLI: exit 2, one line, no output file.
    const std::string out = temp_path("verify_local_rope_merged.kvqcal.h5");
    const auto r = run_cmd(bin("calib-capture") + " merge " + f.cal + " " + bp + " --out " + out);
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_NE(r.err.find("provenance.rope_local_inv_freq"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(out));
    std::printf("merge, %s: %s", cs.name, r.err.c_str());
  }
  // Control: the same local RoPE passes the RoPE check (the merge then refuses the shared windows).
  try {
    merge_calib(a, "a", a, "a2");
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("provenance.rope_local"), std::string::npos) << e.what();
  }
}
