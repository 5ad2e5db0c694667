// read_kvq_header: the one place a kvq file's @format and @version are checked. A table of good and
// bad files: each good one gives its kind and version, each bad one a one-line kvq::Error naming
// the file and the field.
#include <gtest/gtest.h>

#include <H5Cpp.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "kvq/io/alloc_file.hpp"
#include "kvq/io/calib_file.hpp"
#include "kvq/io/h5.hpp"
#include "kvq/io/kvq_file.hpp"
#include "kvq/util/error.hpp"
#include "run_cmd.hpp"

using namespace kvq;
namespace fs = std::filesystem;

namespace {

std::string golden(const std::string& f) { return std::string(KVQ_SOURCE_DIR) + "/data/golden/" + f; }
std::string regression(const std::string& f) { return std::string(KVQ_SOURCE_DIR) + "/tests/fuzz/regressions/" + f; }

const std::string kCal = golden("calib-v2.kvqcal.h5");
const std::string kAlloc = golden("cobra-dp-v1.kvqalloc.h5");

void copy_to(const std::string& from, const std::string& to) {
  fs::remove(to);
  fs::copy_file(from, to);
}

template <class T>
void set_root_attr(const std::string& p, const std::string& name, const T& v) {
  h5::quiet();
  H5::H5File f(p, H5F_ACC_RDWR);
  H5::Group g = f.openGroup("/");
  if (g.attrExists(name)) g.removeAttr(name);
  h5::write_attr(g, name, v);
}

void remove_root_attr(const std::string& p, const std::string& name) {
  h5::quiet();
  H5::H5File f(p, H5F_ACC_RDWR);
  f.openGroup("/").removeAttr(name);
}

std::string prefix(const std::string& p, double fraction) {
  std::ifstream in(p, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return bytes.substr(0, size_t(double(bytes.size()) * fraction));
}

}  // namespace

TEST(KvqFile, GoodFilesGiveTheirKindAndVersion) {
  struct Case {
    std::string file;
    KvqFileKind kind;
    int64_t version;
  };
  for (const auto& c : std::vector<Case>{{golden("calib-v1.kvqcal.h5"), KvqFileKind::kCalibration, 1},
                                          {golden("calib-v2.kvqcal.h5"), KvqFileKind::kCalibration, 2},
                                          {golden("block-gtq-v1.kvqalloc.h5"), KvqFileKind::kAllocation, 1},
                                          {golden("cobra-dp-v1.kvqalloc.h5"), KvqFileKind::kAllocation, 1}}) {
    SCOPED_TRACE(c.file);
    const KvqFileHeader any = read_kvq_header(c.file);
    EXPECT_EQ(any.kind, c.kind);
    EXPECT_EQ(any.version, c.version);
    const KvqFileHeader expected = read_kvq_header(c.file, c.kind);
    EXPECT_EQ(expected.kind, c.kind);
    EXPECT_EQ(expected.version, c.version);
  }
  EXPECT_STREQ(format_name(KvqFileKind::kCalibration), "kvq-calibration");
  EXPECT_STREQ(format_name(KvqFileKind::kAllocation), "kvq-allocation");
}

TEST(KvqFile, BadFilesAreOneLineNamingFileAndField) {
  struct Case {
    std::string name;
    std::optional<KvqFileKind> expect;
    std::string message;  // a substring of the error
    std::function<void(const std::string&)> make;
  };
  const std::vector<Case> cases = {
      {"missing_file", std::nullopt, "cannot open for reading", [](const std::string&) {}},
      {"not_hdf5", std::nullopt, "not an HDF5 file", [](const std::string& p) { test::write_text(p, "{}\n"); }},
      {"empty", std::nullopt, "not an HDF5 file", [](const std::string& p) { test::write_text(p, ""); }},
      {"truncated_calib", std::nullopt, "corrupt HDF5 file", [](const std::string& p) { test::write_text(p, prefix(kCal, 1.0 / 3)); }},
      {"truncated_alloc", KvqFileKind::kAllocation, "corrupt HDF5 file",
       [](const std::string& p) { test::write_text(p, prefix(kAlloc, 0.05)); }},
      {"no_format", std::nullopt, "/@format: missing: not a kvq calibration or allocation file",
       [](const std::string& p) { h5::create(p); }},
      {"no_format_expect_calib", KvqFileKind::kCalibration, "/@format: missing: not a kvq calibration file",
       [](const std::string& p) { h5::create(p); }},
      {"format_not_a_string", std::nullopt, "/@format: not a string",
       [](const std::string& p) { copy_to(kAlloc, p); set_root_attr(p, "format", int64_t(1)); }},
      {"wrong_format_name", std::nullopt,
       "/@format: found 'kvq-allocations', expected 'kvq-calibration' or 'kvq-allocation'",
       [](const std::string& p) { copy_to(kAlloc, p); set_root_attr(p, "format", std::string("kvq-allocations")); }},
      {"other_kind", KvqFileKind::kAllocation, "/@format: expected 'kvq-allocation', found 'kvq-calibration'",
       [](const std::string& p) { copy_to(kCal, p); }},
      {"other_kind_calib", KvqFileKind::kCalibration, "/@format: expected 'kvq-calibration', found 'kvq-allocation'",
       [](const std::string& p) { copy_to(kAlloc, p); }},
      {"unknown_expecting", KvqFileKind::kCalibration, "/@format: expected 'kvq-calibration', found 'hdf5-thing'",
       [](const std::string& p) { copy_to(kCal, p); set_root_attr(p, "format", std::string("hdf5-thing")); }},
      {"no_version", std::nullopt, "/@version: attribute missing",
       [](const std::string& p) { copy_to(kAlloc, p); remove_root_attr(p, "version"); }},
      {"version_not_an_integer", std::nullopt, "/@version: not an integer",
       [](const std::string& p) { copy_to(kAlloc, p); set_root_attr(p, "version", std::string("1")); }},
      {"future_alloc", std::nullopt, "/@version: expected version 1..8, found 9 (written by a newer kvq)",
       [](const std::string& p) { copy_to(kAlloc, p); set_root_attr(p, "version", int64_t(9)); }},
      {"future_calib", KvqFileKind::kCalibration, "/@version: expected version 1..8, found 99 (written by a newer kvq)",
       [](const std::string& p) { copy_to(kCal, p); set_root_attr(p, "version", int64_t(99)); }},
      {"retired_calib", std::nullopt, "/@version: expected version 1..8, found 0 (no longer supported)",
       [](const std::string& p) { copy_to(kCal, p); set_root_attr(p, "version", int64_t(0)); }},
      // Fuzzing found these: HDF5 throws opening the root group, asking whether an attribute
      // exists, and a 16-element version attribute.
      {"fuzz_root_group", std::nullopt, "unreadable",
       [](const std::string& p) { copy_to(regression("alloc/root-group-throws"), p); }},
      {"fuzz_attr_exists", std::nullopt, "/@format: unreadable attribute",
       [](const std::string& p) { copy_to(regression("alloc/attr-exists-throws"), p); }},
      {"fuzz_version_16_values", std::nullopt, "/@version: holds 16 values, expected one",
       [](const std::string& p) { copy_to(regression("alloc/version-attr-16-values"), p); }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string p = test::temp_path("kvq_file_" + c.name + ".h5");
    fs::remove(p);
    c.make(p);
    try {
      read_kvq_header(p, c.expect);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      const size_t at = msg.find(p);
      ASSERT_NE(at, std::string::npos) << msg;
      EXPECT_NE(msg.find(c.message, at + p.size()), std::string::npos) << msg;  // not a match in the path
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a kvq::Error: " << e.what();
    }
    fs::remove(p);
  }
}

// Every corrupt input the fuzzers found: read_kvq_header either reads a format and version (the
// damage is further in) or refuses with a kvq::Error naming the file; nothing else escapes.
TEST(KvqFile, FuzzRegressionsNeverEscape) {
  int n = 0;
  for (const char* target : {"alloc", "calib"})
    for (const auto& e : fs::directory_iterator(regression(target))) {
      const std::string f = e.path().string();
      SCOPED_TRACE(f);
      ++n;
      try {
        read_kvq_header(f);
      } catch (const Error& err) {
        EXPECT_NE(std::string(err.what()).find(f), std::string::npos) << err.what();
      } catch (...) {
        ADD_FAILURE() << "not a kvq::Error";
      }
    }
  EXPECT_GE(n, 10);
}
