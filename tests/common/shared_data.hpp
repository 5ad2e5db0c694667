#pragma once
// Locating ../shared data from tests; a user's clone has none, so tests that need it skip.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace kvq::test {

inline std::string shared_path(const std::string& rel) {
  return std::string(KVQ_SHARED_DIR) + "/" + rel;
}

}  // namespace kvq::test

// Skips the current test (with a clear message) when ../shared/<rel> is absent.
#define KVQ_REQUIRE_SHARED(rel)                                                              \
  do {                                                                                       \
    if (!std::filesystem::exists(::kvq::test::shared_path(rel)))                             \
      GTEST_SKIP() << "needs ../shared/" << (rel)                                            \
                   << " (CI has it; a user's clone does not)";                               \
  } while (0)
