// A table of corrupt allocation files: each is refused with one line naming the file and field.
// Also: the optional /solver datasets (before-C2 distortions) round-trip and may be absent.
#include <gtest/gtest.h>

#include <H5Cpp.h>

#include <filesystem>
#include <cmath>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "kvq/io/alloc_file.hpp"
#include "kvq/io/h5.hpp"
#include "kvq/io/h5_paths.hpp"
#include "kvq/util/error.hpp"
#include "run_cmd.hpp"

using namespace kvq;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::string kGood = std::string(KVQ_SOURCE_DIR) + "/data/golden/cobra-dp-v1.kvqalloc.h5";
const std::string kCompact = std::string(KVQ_SOURCE_DIR) + "/data/golden/block-gtq-compact-v4.kvqalloc.h5";

void rewrite_manifest(const std::string& p, const std::function<void(json&)>& edit) {
  h5::quiet();
  H5::H5File f(p, H5F_ACC_RDWR);
  H5::Group g = f.openGroup("/");
  json m = json::parse(h5::read_attr_str(p, g, "manifest"));
  edit(m);
  g.removeAttr("manifest");
  h5::write_attr(g, "manifest", m.dump());
}

// A copy of `from` whose root attribute "version" says `v`.
void copy_with_version(const std::string& from, const std::string& p, int64_t v) {
  fs::copy_file(from, p);
  H5::H5File f(p, H5F_ACC_RDWR);
  H5::Group g = f.openGroup("/");
  g.removeAttr("version");
  h5::write_attr(g, "version", v);
}

// Edits the f32 dataset /tensors/<name of(manifest)> in place.
void edit_tensor(const std::string& p, const std::function<std::string(const json&)>& name_of,
                 const std::function<void(std::vector<float>&)>& edit) {
  H5::H5File f(p, H5F_ACC_RDONLY);
  const std::string name = name_of(json::parse(h5::read_attr_str(p, f.openGroup("/"), "manifest")));
  f.close();
  H5::H5File w(p, H5F_ACC_RDWR);
  auto ds = w.openDataSet(h5path::child(h5path::kTensors, name));
  hsize_t dims[2];
  ds.getSpace().getSimpleExtentDims(dims);
  std::vector<float> v(dims[0] * dims[1]);
  ds.read(v.data(), H5::PredType::NATIVE_FLOAT);
  edit(v);
  ds.write(v.data(), H5::PredType::NATIVE_FLOAT);
}

void set_root_attr(const std::string& p, const std::string& name, const std::string& v) {
  h5::quiet();
  H5::H5File f(p, H5F_ACC_RDWR);
  H5::Group g = f.openGroup("/");
  g.removeAttr(name);
  h5::write_attr(g, name, v);
}

// Adds /solver/<name> f64 of `dims` to a copy of a file that has no /solver group.
void add_solver_dataset(const std::string& p, const std::string& name, std::vector<hsize_t> dims,
                        const std::vector<double>& v) {
  h5::quiet();
  H5::H5File f(p, H5F_ACC_RDWR);
  H5::Group root = f.openGroup("/");
  const char* solver = h5path::leaf(h5path::kSolver);
  H5::Group g = h5::exists(root, solver) ? root.openGroup(solver) : h5::make_group(root, solver);
  h5::write(g, name, dims, v.data());
}

// The root dataset "manifest" of `bytes` (written with HDF5's own API, not kvq's helper), of
// element type `type` and shape {n} or {n/2, 2}.
void add_manifest_dataset(const std::string& p, const std::string& bytes,
                          const H5::PredType& type = H5::PredType::STD_U8LE, bool rank2 = false) {
  h5::quiet();
  H5::H5File f(p, H5F_ACC_RDWR);
  const hsize_t n = bytes.size();
  const hsize_t dims1[1] = {n}, dims2[2] = {n / 2, 2};
  H5::DataSpace space = rank2 ? H5::DataSpace(2, dims2) : H5::DataSpace(1, dims1);
  H5::DataSet ds = f.createDataSet("manifest", type, space);
  if (type == H5::PredType::STD_U8LE) ds.write(bytes.data(), H5::PredType::NATIVE_UINT8);
}

// A copy of `from` at version `v` whose manifest lives in the /manifest dataset (as version 5
// writes it): the attribute's text moved there byte for byte.
void copy_with_manifest_dataset(const std::string& from, const std::string& p, int64_t v) {
  copy_with_version(from, p, v);
  std::string text;
  {
    H5::H5File f(p, H5F_ACC_RDWR);
    H5::Group g = f.openGroup("/");
    text = h5::read_attr_str(p, g, "manifest");
    g.removeAttr("manifest");
  }
  add_manifest_dataset(p, text);
}

int first_compact(const json& m) {
  for (size_t i = 0; i < m["heads"].size(); ++i)
    if (m["heads"][i].contains("group_norms")) return int(i);
  return -1;
}

// A copy of the v4 golden with its first compact head's group_norms edited.
std::function<void(const std::string&)> edit_compact(std::function<void(json&)> edit) {
  return [edit](const std::string& p) {
    fs::copy_file(kCompact, p);
    rewrite_manifest(p, [&](json& m) { edit(m["heads"][first_compact(m)]["group_norms"]); });
  };
}

int first_lowrank(const json& m) {
  for (size_t i = 0; i < m["heads"].size(); ++i)
    if (m["heads"][i]["kind"] == "lowrank-hadamard") return int(i);
  return -1;
}

}  // namespace

TEST(AllocFileBad, Table) {
  struct Case {
    std::string name, expect;
    std::function<void(const std::string&)> make;
  };
  const auto size = fs::file_size(kGood);
  std::vector<Case> cases = {
      {"not_hdf5", "not an HDF5 file", [](const std::string& p) { test::write_text(p, "{}"); }},
      {"calibration_file", "expected 'kvq-allocation', found 'kvq-calibration'",
       [](const std::string& p) {
         fs::copy_file(std::string(KVQ_SOURCE_DIR) + "/data/golden/calib-v1.kvqcal.h5", p);
       }},
      {"future_version", "found 9 (written by a newer kvq)",
       [](const std::string& p) { copy_with_version(kGood, p, 9); }},
      {"manifest_not_json", "/@manifest: not valid JSON",
       [](const std::string& p) { fs::copy_file(kGood, p); set_root_attr(p, "manifest", "{\"heads\": ["); }},
      {"missing_budget", "manifest.budget",
       [](const std::string& p) { fs::copy_file(kGood, p); rewrite_manifest(p, [](json& m) { m.erase("budget"); }); }},
      {"wrong_type", "manifest.method",
       [](const std::string& p) { fs::copy_file(kGood, p); rewrite_manifest(p, [](json& m) { m["method"] = 3; }); }},
      {"head_missing", "expected 16 decisions",
       [](const std::string& p) {
         fs::copy_file(kGood, p);
         rewrite_manifest(p, [](json& m) { m["heads"].erase(0); });
       }},
      {"rank_too_big", ".rank: out of 0..64: 1000",
       [](const std::string& p) {
         fs::copy_file(kGood, p);
         rewrite_manifest(p, [](json& m) { m["heads"][first_lowrank(m)]["rank"] = 1000; });
       }},
      {"basis_shape", "but the header implies",
       [](const std::string& p) {
         fs::copy_file(kGood, p);
         rewrite_manifest(p, [](json& m) {
           auto& h = m["heads"][first_lowrank(m)];
           h["rank"] = int(h["rank"]) - 2;
         });
       }},
      {"bad_side", "must be K or V",
       [](const std::string& p) { fs::copy_file(kGood, p); rewrite_manifest(p, [](json& m) { m["heads"][0]["side"] = "Q"; }); }},
      {"huge_head_dim", "implausible shape",
       [](const std::string& p) {
         fs::copy_file(kGood, p);
         rewrite_manifest(p, [](json& m) { m["calibration"]["head_dim"] = 1 << 28; });
       }},
      {"nan_basis", "non-finite",
       [](const std::string& p) {
         fs::copy_file(kGood, p);
         edit_tensor(p, [](const json& m) { return m["heads"][first_lowrank(m)]["basis"].get<std::string>(); },
                     [](std::vector<float>& v) { v[3] = std::nanf(""); });
       }},
      // Compact group norms (version 4).
      {"compact_in_v3", "group_norms: needs allocation version >= 4, the file is version 3",
       [](const std::string& p) { copy_with_version(kCompact, p, 3); }},
      {"compact_kind", "group_norms.kind: must be \"compact\"", edit_compact([](json& g) { g["kind"] = "fp8"; })},
      {"compact_ratio_bits", "group_norms.ratio_bits: out of 1..8: 9", edit_compact([](json& g) { g["ratio_bits"] = 9; })},
      {"compact_ratio_bits_float", "ratio_bits: not an integer", edit_compact([](json& g) { g["ratio_bits"] = 2.5; })},
      {"compact_lo_null", "group_norms.norm_log2_lo: must be a finite number, found null",
       edit_compact([](json& g) { g["norm_log2_lo"] = nullptr; })},
      {"compact_step_zero", "norm_log2_step", edit_compact([](json& g) { g["norm_log2_step"] = 0.0; })},
      {"compact_levels_overflow", "outside a float's range", edit_compact([](json& g) { g["norm_log2_lo"] = 126.9; })},
      {"compact_ratios_missing", "nope", edit_compact([](json& g) { g["ratios"] = "nope"; })},
      {"compact_ratios_shape", "but the header implies", edit_compact([](json& g) { g["ratio_bits"] = 5; })},
      {"compact_one_group", "need >= 2 groups",
       [](const std::string& p) {
         fs::copy_file(kCompact, p);
         rewrite_manifest(p, [](json& m) {
           auto& h = m["heads"][first_compact(m)];
           json all = json::array();
           for (auto& g : h["groups"])
             for (auto& x : g["dims"]) all.push_back(x);
           h["groups"] = json::array({h["groups"][0]});
           h["groups"][0]["dims"] = all;
         });
       }},
      {"compact_negative_ratio", "ratio_codebook: value at 1 is not finite and >= 0",
       [](const std::string& p) {
         fs::copy_file(kCompact, p);
         edit_tensor(p, [](const json& m) { return m["heads"][first_compact(m)]["group_norms"]["ratios"].get<std::string>(); },
                     [](std::vector<float>& v) { v[1] = -0.25f; });
       }},
      // The manifest in the /manifest dataset (version 5: a manifest too large for an attribute).
      {"v5_manifest_in_attribute", "/@manifest: a version-5 file keeps its manifest in the /manifest dataset",
       [](const std::string& p) { copy_with_version(kGood, p, 5); }},
      {"v5_manifest_missing", "/manifest: dataset missing",
       [](const std::string& p) {
         copy_with_manifest_dataset(kGood, p, 5);
         H5::H5File f(p, H5F_ACC_RDWR);
         f.unlink("manifest");
       }},
      {"v4_manifest_dataset", "/manifest: a manifest dataset needs allocation version >= 5, the file is version 4",
       [](const std::string& p) { copy_with_manifest_dataset(kCompact, p, 4); }},
      {"v5_manifest_not_json", "/manifest: not valid JSON",
       [](const std::string& p) {
         copy_with_manifest_dataset(kGood, p, 5);
         H5::H5File(p, H5F_ACC_RDWR).unlink("manifest");
         add_manifest_dataset(p, "{\"heads\": [");
       }},
      {"v5_manifest_rank2", "/manifest: expected a 1-D dataset of bytes, found rank 2",
       [](const std::string& p) {
         copy_with_manifest_dataset(kGood, p, 5);
         H5::H5File(p, H5F_ACC_RDWR).unlink("manifest");
         add_manifest_dataset(p, "{}{}", H5::PredType::STD_U8LE, true);
       }},
      {"v5_manifest_floats", "/manifest: wrong element type",
       [](const std::string& p) {
         copy_with_manifest_dataset(kGood, p, 5);
         H5::H5File(p, H5F_ACC_RDWR).unlink("manifest");
         add_manifest_dataset(p, "0123", H5::PredType::IEEE_F32LE);
       }},
      // The golden file: 4 layers x 2 KV heads.
      {"before_shape", "but the header implies",
       [](const std::string& p) {
         fs::copy_file(kGood, p);
         add_solver_dataset(p, "k_distortion_before", {8}, std::vector<double>(8, 1.0));
       }},
      {"before_negative", "/solver/v_distortion_before: negative or NaN",
       [](const std::string& p) {
         fs::copy_file(kGood, p);
         std::vector<double> v(8, 1.0);
         v[5] = -0.5;
         add_solver_dataset(p, "v_distortion_before", {4, 2}, v);
       }},
      {"before_nan", "/solver/k_distortion_before: negative or NaN",
       [](const std::string& p) {
         fs::copy_file(kGood, p);
         std::vector<double> v(8, 1.0);
         v[0] = std::nan("");
         add_solver_dataset(p, "k_distortion_before", {4, 2}, v);
       }},
  };
  for (double frac : {0.05, 0.5, 0.95})
    cases.push_back({"truncated_" + std::to_string(int(frac * 100)), "", [frac, size](const std::string& p) {
                       fs::copy_file(kGood, p);
                       fs::resize_file(p, uintmax_t(double(size) * frac));
                     }});
  for (const auto& c : cases) {
    auto p = test::temp_path("bad_" + c.name + ".kvqalloc.h5");
    fs::remove(p);
    c.make(p);
    std::string err;
    try {
      read_alloc(p);
    } catch (const Error& e) {
      err = e.what();
    }
    EXPECT_FALSE(err.empty()) << c.name << ": accepted";
    EXPECT_NE(err.find(p), std::string::npos) << c.name << ": " << err;
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.name << ": " << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << c.name;
  }
}

// Version 5 only moves the manifest: the same text in the dataset reads as the same decisions.
TEST(AllocFileManifestDataset, SmallManifestInTheDatasetReadsTheSame) {
  for (const std::string& from : {kGood, kCompact}) {
    SCOPED_TRACE(from);
    const std::string p = test::temp_path("manifest_dataset.kvqalloc.h5");
    fs::remove(p);
    copy_with_manifest_dataset(from, p, 5);
    json a = alloc_manifest(read_alloc(from)), b = alloc_manifest(read_alloc(p));
    EXPECT_EQ(b, a);
  }
}

TEST(AllocFileSolver, BeforeC2DistortionsAreOptionalAndRoundTrip) {
  // The golden file predates them: it reads, with none.
  AllocFile a = read_alloc(kGood);
  EXPECT_TRUE(a.k_distortion_before.empty());
  EXPECT_TRUE(a.v_distortion_before.empty());
  const size_t n = size_t(a.calib.n_layers) * size_t(a.calib.n_kv_heads);
  std::vector<double> k(n);
  for (size_t i = 0; i < n; ++i) k[i] = 0.1 * double(i) + 1.0 / 3.0;
  k[1] = std::numeric_limits<double>::infinity();  // an even split below every measured point
  for (int with_v : {0, 1}) {
    SCOPED_TRACE(with_v);
    a.k_distortion_before = k;
    a.v_distortion_before = with_v ? std::vector<double>(n, 0.25) : std::vector<double>{};
    const std::string p = test::temp_path("solver_rt.kvqalloc.h5");
    write_alloc(p, a);
    const AllocFile b = read_alloc(p);
    EXPECT_EQ(b.k_distortion_before, a.k_distortion_before) << "stored bit for bit";
    EXPECT_EQ(b.distortion_before(Side::kV), a.v_distortion_before);
    EXPECT_EQ(alloc_manifest(b), alloc_manifest(a)) << "the manifest does not carry them";
  }
  // Nothing to store: no /solver group at all.
  a.k_distortion_before.clear();
  a.v_distortion_before.clear();
  const std::string p = test::temp_path("solver_none.kvqalloc.h5");
  write_alloc(p, a);
  H5::H5File f(p, H5F_ACC_RDONLY);
  EXPECT_FALSE(h5::exists(f.openGroup("/"), "solver"));
}
