// kvq-allocate's methods as its flags name them: which side each allocates, their names, and the
// --method / --v-method / --formats values.
#include "kvq/pipeline/allocation_methods.hpp"

#include <algorithm>

#include "kvq/format/decision_layout.hpp"
#include "kvq/util/error.hpp"

namespace kvq {
namespace {

// The names of the methods allocates() accepts for `side`, "a, b, c<last>d".
std::string method_names(Side side, const char* last) {
  std::vector<std::string> names;
  for (const auto& e : kMethodNames)
    if (allocates(e.method, side)) names.emplace_back(e.name);
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i == 0 ? "" : i + 1 == names.size() ? last : ", ") + names[i];
  return s;
}

}  // namespace

bool allocates(Method m, Side side) {
  switch (m) {
    case Method::kUniform:
    case Method::kCobraMse:
    case Method::kCobraDp:
    case Method::kCobraMeasured: return true;
    case Method::kBlockGtq:
    case Method::kCobraKl: return side == Side::kK;
    case Method::kKivi: return false;  // a baseline of kvq-verify, not an allocation
    case Method::kLayerPrecision: return true;  // K and V together (--v-method must match)
  }
  return false;
}

std::string allocation_method_names(Side side) { return method_names(side, ", "); }

Method allocation_method_from_flag(const std::string& flag, const std::string& name, Side side) {
  Method m;
  try {
    m = method_from_string(name);
  } catch (const Error&) {
    throw Error("", flag, "unknown method '" + name + "' (" + allocation_method_names(Side::kK) + ")");
  }
  check_allocation_method(flag, m, side);
  return m;
}

void check_allocation_method(const std::string& flag, Method m, Side side) {
  if (allocates(m, side)) return;
  if (allocates(m, Side::kK))
    throw Error("", flag, "'" + std::string(to_string(m)) + "' allocates keys only (it needs RoPE blocks / queries); use " +
                              method_names(Side::kV, " or ") + " for V");
  throw Error("", flag, "unknown method '" + std::string(to_string(m)) + "' (" + allocation_method_names(Side::kK) + ")");
}

std::vector<MinifloatFormat> minifloat_formats_from_flag(const std::string& flag, const std::string& list) {
  std::vector<MinifloatFormat> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string name = list.substr(pos, comma - pos);
    MinifloatFormat f;
    if (name == to_string(MinifloatFormat::kFp8E4M3)) f = MinifloatFormat::kFp8E4M3;
    else if (name == to_string(MinifloatFormat::kNvfp4)) f = MinifloatFormat::kNvfp4;
    else throw Error("", flag, "unknown format '" + name + "' in '" + list + "' (valid: fp8, nvfp4)");
    if (std::find(out.begin(), out.end(), f) != out.end())
      throw Error("", flag, "format '" + name + "' given twice in '" + list + "'");
    out.push_back(f);
    pos = comma + 1;
  }
  return out;
}

}  // namespace kvq
