// A hybrid decoder (Qwen3.5-MoE: Gated DeltaNet on three layers of four, gated attention on the
// fourth) through calib-capture, kvq-allocate and kvq-inspect: the calibration file's layers are the
// layers with a KV cache, recorded with their decoder layers (version 8) — which ones is computed here
// from config.json as transformers reads it (text_config.layer_types, else every
// full_attention_interval-th layer) — every per-layer payload is sized by them, the allocation file
// carries the map (version 8) and kvq-inspect names it. Bad maps (length, range, order, a decoder
// count below the layers, the keys in a version-7 file, an allocation of version 7) are refused in one
// line naming the field. (That the captured rows are the attention layers' own is
// test_model_qwen3_5's CapturesAreTheAttentionLayers, against the float64 reference.)
#include <gtest/gtest.h>

#include <H5Cpp.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>

#include "kvq/io/alloc_file.hpp"
#include "kvq/io/calib_file.hpp"
#include "kvq/io/h5.hpp"
#include "kvq/util/error.hpp"
#include "h5_root.hpp"
#include "run_cmd.hpp"
#include "tiny_family_files.hpp"
#include "bad_provenance.hpp"

namespace fs = std::filesystem;
using namespace kvq;
using kvq::test::bin;
using kvq::test::run_cmd;
using kvq::test::temp_path;
using kvq::test::slurp;

namespace {

constexpr int kSeqLen = 32;

test::TinyFiles make_files() { return test::make_tiny_files("hybrid_calib", "qwen3_5_moe", kSeqLen, "block-gtq", 2); }


// The full-attention layers as transformers' Qwen3_5TextConfig reads them: layer_types, else
// "full_attention" where (i + 1) % full_attention_interval == 0 (interval 4 by default).
std::vector<int> full_attention_layers(const nlohmann::json& tc) {
  const int n = tc.at("num_hidden_layers").get<int>();
  std::vector<int> out;
  for (int i = 0; i < n; ++i) {
    const bool full = tc.contains("layer_types") ? tc["layer_types"][size_t(i)] == "full_attention"
                                                 : (i + 1) % tc.value("full_attention_interval", 4) == 0;
    if (full) out.push_back(i);
  }
  return out;
}


std::string alloc_error(const std::string& path) {
  try {
    read_alloc(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}


}  // namespace

TEST(HybridCalib, OnlyTheAttentionLayersAreCapturedAndRecorded) {
  const test::TinyFiles f = make_files();
  const CalibFile c = read_calib(f.cal, true);
  const auto& p = c.prov;
  EXPECT_EQ(c.format_version, 8);
  EXPECT_EQ(kvq::test::read_root_text_raw(f.cal, "provenance").version, 8);
  const nlohmann::json cfg = nlohmann::json::parse(slurp(f.model + "/config.json"));
  const nlohmann::json& tc = cfg.at("text_config");
  const std::vector<int> full = full_attention_layers(tc);
  ASSERT_GE(full.size(), 2u);
  ASSERT_LT(full.size(), size_t(tc.at("num_hidden_layers").get<int>()));
  EXPECT_EQ(p.decoder_layers, full);
  EXPECT_EQ(p.n_decoder_layers, tc.at("num_hidden_layers").get<int>());
  EXPECT_EQ(p.n_layers, int(full.size()));
  EXPECT_EQ(p.n_kv_heads, tc.at("num_key_value_heads").get<int>());
  EXPECT_EQ(p.head_dim, tc.at("head_dim").get<int>());
  for (size_t l = 0; l < full.size(); ++l) EXPECT_EQ(p.decoder_index(int(l)), full[l]);
  // Every per-layer payload holds the KV layers and no other.
  const auto sh = c.shape();
  EXPECT_EQ(sh.n_layers, int(full.size()));
  const size_t L = full.size(), Hk = size_t(p.n_kv_heads), d = size_t(p.head_dim);
  EXPECT_EQ(c.holdout.k.size(), L * size_t(c.holdout.windows) * kSeqLen * Hk * d);
  EXPECT_EQ(c.reservoir.k.size(), size_t(c.reservoir.size()) * L * Hk * d);
  std::printf("KV layers %s of %d decoder layers; calibration version %lld\n",
              nlohmann::json(p.decoder_layers).dump().c_str(), p.n_decoder_layers, (long long)c.format_version);

  // The allocation carries the map (version 8) and allocates the KV layers' heads only.
  const AllocFile a = read_alloc(f.alloc);
  EXPECT_EQ(a.calib.decoder_layers, full);
  EXPECT_EQ(a.calib.n_decoder_layers, p.n_decoder_layers);
  EXPECT_EQ(alloc_version_for(a), 8);
  for (const HeadDecision& h : a.heads) EXPECT_LT(h.layer, int(L));
  EXPECT_EQ(a.heads.size(), 2 * L * Hk);

  // kvq-inspect names the decoder layers.
  const std::string txt = temp_path("hybrid_calib_inspect.txt");
  const auto r = run_cmd(bin("kvq-inspect") + " " + f.cal + " > " + txt);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string out = slurp(txt);
  const size_t at = out.find("\n  hybrid ");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string line = out.substr(at + 1, out.find('\n', at + 1) - at - 1);
  std::string want = "decoder layer";
  for (int l : full) want += " " + std::to_string(l);
  EXPECT_NE(line.find(want), std::string::npos) << line;
  std::printf("kvq-inspect: %s\n", line.c_str());
}

TEST(HybridCalib, BadDecoderLayersAreRefusedInOneLine) {
  const test::TinyFiles f = make_files();
  const CalibFile good = read_calib(f.cal, true);
  ASSERT_TRUE(good.prov.hybrid());
  const int L = good.prov.n_layers;
  const std::vector<test::BadProvenance> cases = {
      {"short", [](CalibProvenance& p) { p.decoder_layers.pop_back(); }, "provenance.decoder_layers", "entries for n_layers"},
      {"long", [](CalibProvenance& p) { p.decoder_layers.push_back(p.n_decoder_layers - 1); }, "provenance.decoder_layers",
       "entries for n_layers"},
      {"past_the_decoder", [](CalibProvenance& p) { p.decoder_layers.back() = p.n_decoder_layers; },
       "provenance.decoder_layers[", "is not an ascending decoder layer"},
      {"negative", [](CalibProvenance& p) { p.decoder_layers[0] = -1; }, "provenance.decoder_layers[0]",
       "is not an ascending decoder layer"},
      {"not_ascending", [](CalibProvenance& p) { std::swap(p.decoder_layers[0], p.decoder_layers[1]); },
       "provenance.decoder_layers[1]", "is not an ascending decoder layer"},
      {"decoder_count", [L](CalibProvenance& p) { p.n_decoder_layers = L - 1; }, "provenance.n_decoder_layers",
       "is not between n_layers"},
  };
  const std::string out = temp_path("hybrid_calib_bad.kvqalloc.h5");
  test::expect_bad_provenance_refused(
      good, "hybrid_calib_bad", cases,
      [&](const std::string& path) { return bin("kvq-allocate") + " -q --calib " + path + " --method uniform --bpd 4 --out " + out; },
      out);
  // The keys in a file of version 7.
  test::expect_keys_refused_below(good, "hybrid_calib", 8, "provenance.decoder_layers");

  // The allocation file: a map of another length, and the keys in a version-7 file.
  AllocFile a = read_alloc(f.alloc);
  a.calib.decoder_layers.pop_back();
  const std::string bad = temp_path("hybrid_calib_bad_map.kvqalloc.h5");
  write_alloc(bad, a);
  const std::string aerr = alloc_error(bad);
  EXPECT_NE(aerr.find("manifest.calibration.decoder_layers"), std::string::npos) << aerr;
  EXPECT_EQ(aerr.find('\n'), std::string::npos) << aerr;
  std::printf("allocation, short map: %s\n", aerr.c_str());
}
