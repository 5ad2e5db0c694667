// The calibration file format: round trip, determinism, and a table of corrupt files.
#include <gtest/gtest.h>

#include <H5Cpp.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "kvq/io/calib_file.hpp"
#include "kvq/io/h5.hpp"
#include "kvq/io/h5_paths.hpp"
#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"
#include "kvq/util/sha256.hpp"
#include "run_cmd.hpp"

using namespace kvq;

namespace {

CalibFile small_file() {
  CalibFile c;
  MomentShape sh{2, 2, 4, 4};
  c.prov.tool_version = "test";
  c.prov.model_path = "m";
  c.prov.model_config_sha256 = std::string(64, 'a');
  c.prov.architecture = "llama";
  c.prov.pairing = RopePairing::kInterleaved;
  c.prov.rotary_dim = 4;
  c.prov.rope_theta = 10000;
  c.prov.rope_inv_freq = rope_default_inv_freq(c.prov.rope_theta, c.prov.rotary_dim);
  c.prov.head_dim = 4;
  c.prov.n_layers = 2;
  c.prov.n_heads = 4;
  c.prov.n_kv_heads = 2;
  c.prov.gqa_map = {0, 0, 1, 1};
  c.prov.corpus = {{"c.txt", std::string(64, 'b'), 10, 0}};
  c.prov.seq_len = 3;
  c.prov.samples = 2;
  c.prov.holdout = 1;
  c.prov.batch_size = 1;
  c.prov.reservoir_tokens = 2;
  c.moments = Moments(sh);
  for (auto* s : {&c.moments.k, &c.moments.v, &c.moments.q}) {
    for (size_t i = 0; i < s->count.size(); ++i) s->count[i] = int64_t(3 + i);
    for (size_t i = 0; i < s->sum.size(); ++i) s->sum[i] = 0.25 * double(i) - 1;
    for (size_t i = 0; i < s->gram.size(); ++i) s->gram[i] = std::sqrt(double(i) + 1);
  }
  c.calib_offsets = {0, 2};
  c.holdout_offsets = {4};
  c.windows_done = 2;
  c.reservoir.capacity = 2;
  c.reservoir.seen = 6;
  c.reservoir.rng_state = {1, 2, 3, 4};
  c.reservoir.source = {0, 1, 1, 2};
  c.reservoir.q.assign(2 * 2 * 4 * 4, 0.5f);
  c.reservoir.k.assign(2 * 2 * 2 * 4, 0.25f);
  c.reservoir.v.assign(2 * 2 * 2 * 4, -0.25f);
  c.holdout.windows = 1;
  c.holdout.ids = {1, 5, 6};
  c.holdout.positions = {0, 1, 2};
  c.holdout.q.assign(2 * 1 * 3 * 4 * 4, 1.f);
  c.holdout.k.assign(2 * 1 * 3 * 2 * 4, 2.f);
  c.holdout.v.assign(2 * 1 * 3 * 2 * 4, 3.f);
  return c;
}

// small_file with a value dim of 2 beside the key's 4 and a recorded scale (version 5, as MLA's).
CalibFile kv_dims_file() {
  CalibFile c = small_file();
  c.prov.head_dim_v = 2;
  c.prov.softmax_scale = 0.25;
  const SideMoments k = c.moments.k, q = c.moments.q;
  c.moments = Moments(MomentShape{2, 2, 4, 4, 2});
  c.moments.k = k;
  c.moments.q = q;
  for (size_t i = 0; i < c.moments.v.count.size(); ++i) c.moments.v.count[i] = int64_t(3 + i);
  for (size_t i = 0; i < c.moments.v.sum.size(); ++i) c.moments.v.sum[i] = 0.5 * double(i);
  for (size_t i = 0; i < c.moments.v.gram.size(); ++i) c.moments.v.gram[i] = 1.0 + double(i);
  c.reservoir.v.assign(2 * 2 * 2 * 2, -0.25f);
  c.holdout.v.assign(2 * 1 * 3 * 2 * 2, 3.f);
  return c;
}

void set_attr(const std::string& path, const std::string& obj, const std::string& name, int64_t v) {
  h5::quiet();
  H5::H5File f(path, H5F_ACC_RDWR);
  H5::Group g = f.openGroup(obj);
  g.removeAttr(name);
  h5::write_attr(g, name, v);
}

std::string error_of(const std::string& path) {
  try {
    read_calib(path, true);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(CalibFile, RoundTripIsExact) {
  auto p = test::temp_path("rt.kvqcal.h5");
  CalibFile c = small_file();
  c.prov.layer_window = {0, 2};
  write_calib(p, c);
  CalibFile r = read_calib(p, true);
  EXPECT_EQ(r.prov.layer_window, c.prov.layer_window);
  EXPECT_EQ(r.moments.k.gram, c.moments.k.gram);
  EXPECT_EQ(r.moments.q.sum, c.moments.q.sum);
  EXPECT_EQ(r.moments.v.count, c.moments.v.count);
  EXPECT_EQ(r.calib_offsets, c.calib_offsets);
  EXPECT_EQ(r.holdout.k, c.holdout.k);
  EXPECT_EQ(r.reservoir.source, c.reservoir.source);
  EXPECT_EQ(r.reservoir.rng_state, c.reservoir.rng_state);
  EXPECT_EQ(r.prov.gqa_map, c.prov.gqa_map);
  EXPECT_EQ(r.prov.pairing, RopePairing::kInterleaved);
  EXPECT_EQ(calib_content_digest(r), calib_content_digest(c));
}

TEST(CalibFile, SameContentSameBytes) {
  auto a = test::temp_path("a.kvqcal.h5"), b = test::temp_path("b.kvqcal.h5");
  write_calib(a, small_file());
  write_calib(b, small_file());
  EXPECT_EQ(sha256_file(a), sha256_file(b)) << "HDF5 output must not carry timestamps";
}

TEST(CalibFile, NoPartialFileOnFailure) {
  auto p = test::temp_path("never.kvqcal.h5");
  // A writer that throws leaves neither the target nor its temporary behind.
  EXPECT_ANY_THROW(write_atomically(p, [](const std::string&) { throw Error("x"); }));
  EXPECT_FALSE(std::filesystem::exists(p));
}

TEST(CalibFileBad, Table) {
  const auto good = test::temp_path("good.kvqcal.h5");
  write_calib(good, small_file());
  const auto size = std::filesystem::file_size(good);
  struct Case {
    std::string name, expect;
    std::function<void(const std::string&)> make;
  };
  std::vector<Case> cases = {
      {"not_hdf5", "not an HDF5 file", [](const std::string& p) { test::write_text(p, "hello, not hdf5"); }},
      {"empty", "not an HDF5 file", [](const std::string& p) { test::write_text(p, ""); }},
      {"future_version", "found 99 (written by a newer kvq)",
       [&](const std::string& p) { std::filesystem::copy_file(good, p); set_attr(p, "/", "version", 99); }},
      {"past_version", "found 0 (no longer supported)",
       [&](const std::string& p) { std::filesystem::copy_file(good, p); set_attr(p, "/", "version", 0); }},
      {"bad_dims", "/stats@head_dim",
       [&](const std::string& p) { std::filesystem::copy_file(good, p); set_attr(p, h5path::kStats, "head_dim", 1 << 30); }},
      {"wrong_shape", "shape disagrees",
       [&](const std::string& p) { std::filesystem::copy_file(good, p); set_attr(p, h5path::kStats, "head_dim", 8); }},
      {"nan", "non-finite",
       [&](const std::string& p) {
         std::filesystem::copy_file(good, p);
         H5::H5File f(p, H5F_ACC_RDWR);
         auto ds = f.openDataSet(h5path::kStatsGramK);
         std::vector<double> g(2 * 2 * 4 * 4);
         ds.read(g.data(), H5::PredType::NATIVE_DOUBLE);
         g[5] = std::nan("");
         ds.write(g.data(), H5::PredType::NATIVE_DOUBLE);
       }},
      {"window_count", "provenance.layer_window: 3 entries for n_layers 2",
       [](const std::string& p) {
         CalibFile c = small_file();
         c.prov.layer_window = {0, 2, 2};
         write_calib(p, c);
       }},
      {"window_negative", "provenance.layer_window: negative window -4",
       [](const std::string& p) {
         CalibFile c = small_file();
         c.prov.layer_window = {0, -4};
         write_calib(p, c);
       }},
      {"window_not_int", "provenance.layer_window: not an integer in range",
       [&](const std::string& p) {
         std::filesystem::copy_file(good, p);
         H5::H5File f(p, H5F_ACC_RDWR);
         H5::Group g = f.openGroup("/");
         std::string prov = h5::read_attr_str(p, g, "provenance");
         const std::string key = "\"layer_window\": []";
         ASSERT_NE(prov.find(key), std::string::npos) << prov;
         prov.replace(prov.find(key), key.size(), "\"layer_window\": [0, 1.5]");
         g.removeAttr("provenance");
         h5::write_attr(g, "provenance", prov);
       }},
      {"kv_dims_in_version_4", "/stats@head_dim_v: needs calibration version >= 5, the file is version 4",
       [](const std::string& p) {
         write_calib(p, kv_dims_file());
         set_attr(p, "/", "version", 4);
       }},
      {"kv_dims_disagree", "/stats@head_dim_v: 3 disagrees with provenance.head_dim_v 2",
       [](const std::string& p) {
         write_calib(p, kv_dims_file());
         set_attr(p, h5path::kStats, "head_dim_v", 3);
       }},
      {"bad_format", "expected 'kvq-calibration'",
       [&](const std::string& p) {
         std::filesystem::copy_file(good, p);
         H5::H5File f(p, H5F_ACC_RDWR);
         H5::Group g = f.openGroup("/");
         g.removeAttr("format");
         h5::write_attr(g, "format", std::string("kvq-allocation"));
       }},
  };
  for (auto frac : {0.1, 0.5, 0.9, 0.99})
    cases.push_back({"truncated_" + std::to_string(int(frac * 100)), "",
                     [&, frac](const std::string& p) {
                       std::filesystem::copy_file(good, p);
                       std::filesystem::resize_file(p, uintmax_t(double(size) * frac));
                     }});
  for (const auto& c : cases) {
    auto p = test::temp_path("bad_" + c.name + ".kvqcal.h5");
    std::filesystem::remove(p);
    c.make(p);
    std::string err = error_of(p);
    EXPECT_FALSE(err.empty()) << c.name << ": accepted";
    EXPECT_NE(err.find(p), std::string::npos) << c.name << ": message does not name the file: " << err;
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.name << ": " << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << c.name;
  }
}

// A value dim and a softmax scale (MLA): version 5, read back with V at its own dim; the same
// content without them keeps version 3 and its bytes' digest.
TEST(CalibFile, KvDimsRoundTrip) {
  const CalibFile c = kv_dims_file();
  const auto p = test::temp_path("kv_dims.kvqcal.h5");
  write_calib(p, c);
  const CalibFile r = read_calib(p, true);
  EXPECT_EQ(r.format_version, 5);
  EXPECT_EQ(r.prov.head_dim_v, 2);
  EXPECT_EQ(r.prov.softmax_scale, 0.25);
  EXPECT_EQ(r.shape().v_dim(), 2);
  EXPECT_EQ(r.moments.v.sum, c.moments.v.sum);
  EXPECT_EQ(r.moments.v.gram, c.moments.v.gram);
  EXPECT_EQ(r.moments.k.gram, c.moments.k.gram);
  EXPECT_EQ(std::vector<float>(r.reservoir.v.begin(), r.reservoir.v.end()),
            std::vector<float>(c.reservoir.v.begin(), c.reservoir.v.end()));
  EXPECT_EQ(r.holdout.v.size(), c.holdout.v.size());
  EXPECT_EQ(calib_content_digest(r), calib_content_digest(c));
  const auto p3 = test::temp_path("kv_dims_plain.kvqcal.h5");
  write_calib(p3, small_file());
  EXPECT_EQ(read_calib(p3, false).format_version, 3);
}
