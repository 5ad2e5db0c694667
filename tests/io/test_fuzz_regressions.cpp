// Every input that once crashed or exhausted a reader under the fuzzers (tests/fuzz/regressions/) is
// replayed through the plain (uninstrumented) readers the tools use: each must be refused with a
// kvq::Error of one line that names the file — not a crash, not another exception, not accepted.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "kvq/io/alloc_file.hpp"
#include "kvq/io/calib_file.hpp"
#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"

using namespace kvq;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> inputs(const std::string& target) {
  std::vector<std::string> out;
  const fs::path dir = fs::path(KVQ_SOURCE_DIR) / "tests/fuzz/regressions" / target;
  if (fs::is_directory(dir))
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file()) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

template <class Read>
void expect_refused(const std::string& target, Read read) {
  const auto files = inputs(target);
  ASSERT_FALSE(files.empty()) << "no regression inputs for " << target;
  for (const auto& f : files) {
    SCOPED_TRACE(f);
    try {
      read(f);
      ADD_FAILURE() << "accepted a corrupt file";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(f), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "escaped as a non-kvq exception: " << e.what();
    }
  }
}

}  // namespace

TEST(FuzzRegressions, CalibrationFilesAreRefusedNamingTheFile) {
  expect_refused("calib", [](const std::string& f) { (void)read_calib(f, /*samples=*/true); });
}

TEST(FuzzRegressions, AllocationFilesAreRefusedNamingTheFile) {
  expect_refused("alloc", [](const std::string& f) { (void)read_alloc(f); });
}

TEST(FuzzRegressions, ProvenanceJsonIsRefusedNamingTheFile) {
  expect_refused("provenance", [](const std::string& f) { (void)provenance_from_json(f, read_file(f)); });
}
