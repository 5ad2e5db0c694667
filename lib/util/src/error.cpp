#include "kvq/util/error.hpp"

#include <cstdio>
#include <cstdlib>

namespace kvq {

static std::string join(const std::string& file, const std::string& field, const std::string& what) {
  std::string s;
  if (!file.empty()) s += file + ": ";
  if (!field.empty()) s += field + ": ";
  s += what;
  for (char& c : s)
    if (c == '\n') c = ' ';  // the user sees exactly one line
  return s;
}

Error::Error(const std::string& file, const std::string& field, const std::string& what)
    : std::runtime_error(join(file, field, what)) {}

void assert_fail(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "kvq internal error: %s failed at %s:%d\n", expr, file, line);
  std::abort();
}

}  // namespace kvq
