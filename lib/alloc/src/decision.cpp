#include "kvq/alloc/decision.hpp"

#include "kvq/util/error.hpp"

namespace kvq {

namespace {
struct MethodName {
  Method m;
  const char* name;
};
// Names are user-facing (--method) and recorded in files: never rename.
constexpr MethodName kMethodNames[] = {
    {Method::kUniform, "uniform"},         {Method::kBlockGtq, "block-gtq"},
    {Method::kCobraMse, "cobra-mse"},      {Method::kCobraKl, "cobra-kl"},
    {Method::kCobraDp, "cobra-dp"},        {Method::kCobraMeasured, "cobra-measured"},
    {Method::kKivi, "kivi"},
};
}  // namespace

const char* to_string(Method m) {
  for (const auto& e : kMethodNames)
    if (e.m == m) return e.name;
  return "unknown";
}

Method method_from_string(const std::string& s) {
  std::string valid;
  for (const auto& e : kMethodNames) {
    if (s == e.name) return e.m;
    valid += valid.empty() ? "" : ", ";
    valid += e.name;
  }
  throw Error("", "method", "unknown value '" + s + "' (valid: " + valid + ")");
}

}  // namespace kvq
