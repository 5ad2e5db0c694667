// kvq-verify on a model with attention sinks (gpt-oss): calib-capture records the checkpoint's
// self_attn.sinks (read here from the safetensors, BF16 decoded by hand) in a version-6 file, and
// kvq-verify's held-out KL and attention-output error put exp(sink) in every softmax's denominator
// (the KL counts the sink as one more outcome), checked against a brute-force computation written
// here; the same without sinks differs (negative control), while the logit MAE, top-10 (keys only)
// and NMSE do not involve the sink. Also: bad sinks (shape, non-finite, in a version-5 file) are
// refused in one line naming the field, merging files of different sinks is refused, and
// kvq-inspect prints them.
#include <gtest/gtest.h>

#include <H5Cpp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "kvq/capture/capture.hpp"
#include "kvq/codec/attention.hpp"
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

// kvq-make-tiny-hf --family gpt_oss: 2 layers, 4 query heads over 2 KV heads, head_dim 16, even
// layers sliding over 16 tokens, odd layers full.
constexpr int kLayers = 2, kHeads = 4;
const std::vector<int> kWindows = {16, 0};
constexpr int kSeqLen = 48;  // > the window, so the sliding layer's queries lose keys to it

test::TinyFiles make_files() { return test::make_tiny_files("verify_sinks", "gpt_oss", kSeqLen, "uniform", 2); }


// The checkpoint's model.layers.{l}.self_attn.sinks, from the safetensors files themselves: the
// index names the shard; a shard is an 8-byte little-endian header length, the JSON header, then
// the data (offsets relative to its start). BF16 is the upper half of an IEEE float.
std::vector<std::vector<double>> checkpoint_sinks(const std::string& model) {
  const auto index = nlohmann::json::parse(slurp(model + "/model.safetensors.index.json"));
  std::vector<std::vector<double>> out;
  for (int l = 0; l < kLayers; ++l) {
    const std::string name = "model.layers." + std::to_string(l) + ".self_attn.sinks";
    const std::string bytes = slurp(model + "/" + index["weight_map"][name].get<std::string>());
    uint64_t hlen = 0;
    for (int b = 0; b < 8; ++b) hlen |= uint64_t(uint8_t(bytes[size_t(b)])) << (8 * b);
    const auto header = nlohmann::json::parse(bytes.substr(8, hlen));
    const auto& t = header.at(name);
    EXPECT_EQ(t.at("dtype"), "BF16") << name;
    EXPECT_EQ(t.at("shape"), nlohmann::json::array({kHeads})) << name;
    const size_t begin = t.at("data_offsets")[0].get<size_t>(), end = t.at("data_offsets")[1].get<size_t>();
    EXPECT_EQ(end - begin, size_t(2 * kHeads)) << name;
    std::vector<double> row;
    for (size_t at = 8 + hlen + begin; at + 1 < 8 + hlen + end; at += 2) {
      const uint32_t bits = (uint32_t(uint8_t(bytes[at])) | uint32_t(uint8_t(bytes[at + 1])) << 8) << 16;
      float x;
      std::memcpy(&x, &bits, sizeof x);
      row.push_back(double(x));
    }
    out.push_back(row);
  }
  return out;
}

// The allocation's figures for one layer by brute force (verify_brute.hpp) over the attended keys
// (t - W < j <= t), with exp(sink) in the denominator when `sinks` (the sink one more outcome of the
// distribution in the KL, no value in the output, not a key in the top-10).
Metrics brute_force(const CalibFile& c, const AllocFile& a, int layer, bool sinks) {
  test::BruteOptions o;
  o.window = c.prov.window_of(layer);
  o.rotate = test::provenance_rotate(c.prov);
  if (sinks) o.sink = [&c, layer](int g) { return c.prov.attention_sinks[size_t(layer)][size_t(g)]; };
  return test::verify_brute_force(c, a, layer, o);
}



}  // namespace

TEST(VerifySinks, CaptureRecordsTheCheckpointsSinks) {
  const test::TinyFiles f = make_files();
  const CalibFile c = read_calib(f.cal, false);
  EXPECT_EQ(c.format_version, 6);
  EXPECT_EQ(kvq::test::read_root_text_raw(f.cal, "provenance").version, 6);
  EXPECT_EQ(c.prov.architecture, "gpt_oss");
  EXPECT_EQ(c.prov.layer_window, kWindows);
  ASSERT_EQ(c.prov.n_layers, kLayers);
  ASSERT_EQ(c.prov.n_heads, kHeads);
  ASSERT_TRUE(c.prov.has_sinks());
  ASSERT_EQ(c.prov.attention_sinks.size(), size_t(kLayers));
  const auto want = checkpoint_sinks(f.model);
  for (int l = 0; l < kLayers; ++l) {
    ASSERT_EQ(c.prov.attention_sinks[size_t(l)].size(), size_t(kHeads)) << l;
    for (int h = 0; h < kHeads; ++h) {
      const double x = c.prov.attention_sinks[size_t(l)][size_t(h)];
      EXPECT_TRUE(std::isfinite(x));
      EXPECT_EQ(x, want[size_t(l)][size_t(h)]) << "layer " << l << " head " << h;
      EXPECT_EQ(c.prov.sink_of(l, h), x);
    }
  }
  // Sinks N(0, 1): not all alike, so a head mixed up with another shows.
  EXPECT_NE(want[0][0], want[0][1]);
  EXPECT_NE(want[0][0], want[1][0]);

  const std::string txt = temp_path("verify_sinks_inspect.txt");
  const auto r = run_cmd(bin("kvq-inspect") + " " + f.cal + " > " + txt);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string out = slurp(txt);
  const size_t at = out.find("\n  sinks ");
  ASSERT_NE(at, std::string::npos) << out;
  EXPECT_NE(out.substr(at, out.find('\n', at + 1) - at).find("gpt-oss"), std::string::npos) << out;
}

// The captured sinks (N(0, 1) over 16 or more keys of nearly equal logits) take a few percent of
// each row: kvq-verify's KL moves by a few percent with them, its output error (a ratio, and the
// sink scales both outputs alike) by well under one on the sliding layer. The same held-out rows
// under sinks raised by kRaise, where the sink takes most of each row as a trained gpt-oss's often
// does, are checked as well, and there both figures move by far more than the tolerance.
constexpr double kRaise = 3.0;

TEST(VerifySinks, MetricsPutTheSinkInTheSoftmax) {
  const test::TinyFiles f = make_files();
  const CalibFile captured = read_calib(f.cal, true);
  const AllocFile a = read_alloc(f.alloc);
  ASSERT_TRUE(captured.prov.has_sinks());
  ASSERT_EQ(captured.prov.v_dim(), captured.prov.head_dim);
  ASSERT_GT(captured.prov.seq_len, 2 * kWindows[0]);

  // The same rows without sinks: read as the plain softmax.
  CalibFile plain = captured;
  plain.prov.attention_sinks.clear();
  const std::string plain_path = temp_path("verify_sinks_plain.kvqcal.h5");
  write_calib(plain_path, plain);
  EXPECT_LT(read_calib(plain_path, false).format_version, 6);
  const VerifyReport rep_plain = verify_cpu(plain_path, f.alloc);
  ASSERT_EQ(rep_plain.alloc.layers.size(), size_t(kLayers));

  CalibFile raised = captured;
  for (auto& layer : raised.prov.attention_sinks)
    for (double& x : layer) x += kRaise;
  const std::string raised_path = temp_path("verify_sinks_raised.kvqcal.h5");
  write_calib(raised_path, raised);

  for (const bool strong : {false, true}) {
    const CalibFile& c = strong ? raised : captured;
    const VerifyReport rep = verify_cpu(strong ? raised_path : f.cal, f.alloc);
    ASSERT_EQ(rep.alloc.layers.size(), size_t(kLayers));
    for (int l = 0; l < kLayers; ++l) {
      const std::string what = std::string(strong ? "raised" : "captured") + " sinks, layer " + std::to_string(l);
      SCOPED_TRACE(what);
      const Metrics with = brute_force(c, a, l, true), without = brute_force(c, a, l, false);
      const Metrics& got = rep.alloc.layers[size_t(l)];
      expect_same(got, with, "with sinks");
      expect_same(rep_plain.alloc.layers[size_t(l)], without, "without sinks");
      std::printf("%s (window %d): kvq-verify / brute force with sinks / without: KL %.6g / %.6g / %.6g, "
                  "output error %.6g / %.6g / %.6g, logit MAE %.6g / %.6g, top-10 %.6g / %.6g; kvq-verify vs brute "
                  "force (relative): KL %.2g, output error %.2g\n",
                  what.c_str(), kWindows[size_t(l)], got.kl, with.kl, without.kl, got.out_rel_err,
                  with.out_rel_err, without.out_rel_err, got.logit_mae, without.logit_mae, got.top10,
                  without.top10, std::fabs(got.kl - with.kl) / with.kl,
                  std::fabs(got.out_rel_err - with.out_rel_err) / with.out_rel_err);
      // Negative control: without the sink the KL differs from kvq-verify's by at least ten times
      // the tolerance of expect_same; under the raised sinks the output error too.
      EXPECT_GT(std::fabs(got.kl - without.kl), 1e-2 * without.kl);
      if (strong) {
        EXPECT_GT(std::fabs(got.kl - without.kl), 0.2 * without.kl);
        EXPECT_GT(std::fabs(got.out_rel_err - without.out_rel_err), 1e-2 * without.out_rel_err);
      }
      // What does not involve the sink: the logits, the keys' ranking, the coded rows.
      EXPECT_NEAR(got.logit_mae, without.logit_mae, 1e-5 * without.logit_mae);
      EXPECT_NEAR(got.top10, without.top10, 1e-9);
      EXPECT_DOUBLE_EQ(got.nmse_k, rep_plain.alloc.layers[size_t(l)].nmse_k);
      EXPECT_DOUBLE_EQ(got.nmse_v, rep_plain.alloc.layers[size_t(l)].nmse_v);
    }
  }
}

TEST(VerifySinks, BadSinksAreRefusedInOneLine) {
  const test::TinyFiles f = make_files();
  const CalibFile good = read_calib(f.cal, true);
  const std::vector<test::BadProvenance> cases = {
      {"layers", [](CalibProvenance& p) { p.attention_sinks.pop_back(); }, "provenance.attention_sinks",
       "1 layers for n_layers 2"},
      {"heads", [](CalibProvenance& p) { p.attention_sinks[1].pop_back(); }, "provenance.attention_sinks[1]",
       "3 sinks for n_heads 4"},
      // JSON has no NaN: the writer stores null, which the reader refuses as the field's type.
      {"nan", [](CalibProvenance& p) { p.attention_sinks[0][2] = std::numeric_limits<double>::quiet_NaN(); },
       "provenance.attention_sinks", ""},
      {"inf", [](CalibProvenance& p) { p.attention_sinks[1][3] = std::numeric_limits<double>::infinity(); },
       "provenance.attention_sinks", ""},
  };
  // The tools: exit 2, one line naming the field.
  test::expect_bad_provenance_refused(good, "verify_sinks_bad", cases, [&](const std::string& path) {
    return bin("kvq-verify") + " -q --calib " + path + " --alloc " + f.alloc + " --json " + temp_path("verify_sinks_bad.json");
  });
  // The key in a file of version 5 (the provenance dataset as version 6 writes it).
  test::expect_keys_refused_below(good, "verify_sinks", 6, "provenance.attention_sinks",
                                  [](const std::string& path) { return bin("kvq-inspect") + " " + path + " > /dev/null"; });
}

TEST(VerifySinks, MergeRefusesDifferentSinks) {
  const test::TinyFiles f = make_files();
  const CalibFile a = read_calib(f.cal, true);
  CalibFile b = a;
  b.prov.attention_sinks[1][2] += 0.25;
  const std::string bp = temp_path("verify_sinks_other.kvqcal.h5");
  write_calib(bp, b);
  try {
    merge_calib(a, "a.kvqcal.h5", read_calib(bp, true), "b.kvqcal.h5");
    FAIL() << "merged files of different sinks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("provenance.attention_sinks"), std::string::npos) << e.what();
  }
  // The CLI: exit 2, one line, no output file.
  const std::string out = temp_path("verify_sinks_merged.kvqcal.h5");
  const auto r = run_cmd(bin("calib-capture") + " merge " + f.cal + " " + bp + " --out " + out);
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("provenance.attention_sinks"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(fs::exists(out));
  // Control: the same sinks pass the sink check (the merge then refuses the shared windows).
  try {
    merge_calib(a, "a", a, "a2");
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("attention_sinks"), std::string::npos) << e.what();
  }
}
