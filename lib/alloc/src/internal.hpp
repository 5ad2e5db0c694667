#pragma once
// Helpers private to kvq_alloc.
#include <cmath>
#include <cstdio>
#include <string>

#include "kvq/util/error.hpp"

namespace kvq::alloc::detail {

// Shortest readable form of a number for error messages and recorded parameters.
inline std::string num(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", x);
  return buf;
}
inline std::string num(long long x) { return std::to_string(x); }
inline std::string num(long x) { return std::to_string(x); }
inline std::string num(int x) { return std::to_string(x); }
inline std::string num(unsigned long long x) { return std::to_string(x); }
inline std::string num(unsigned long x) { return std::to_string(x); }

[[noreturn]] inline void fail(const std::string& field, const std::string& what) {
  throw Error("", field, what);
}

}  // namespace kvq::alloc::detail
