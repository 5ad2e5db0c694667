#pragma once
// Two error tiers: kvq::Error for bad user input (file, field, value -> one line), KVQ_ASSERT for
// broken internal invariants (abort with location).
#include <stdexcept>
#include <string>

namespace kvq {

class Error : public std::runtime_error {
 public:
  // Message reads "<file>: <field>: <what>" with empty parts left out.
  Error(const std::string& file, const std::string& field, const std::string& what);
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

[[noreturn]] void assert_fail(const char* expr, const char* file, int line);

}  // namespace kvq

#define KVQ_ASSERT(cond) \
  do { if (!(cond)) ::kvq::assert_fail(#cond, __FILE__, __LINE__); } while (0)
