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
    case Method::kLayerPrecision:  // K and V together (--v-method must match)
    case Method::kVllmTurboQuant: return true;
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

std::vector<alloc::KvFormatPair> layer_formats_from_flag(const std::string& flag, const std::string& list) {
  const MinifloatFormat fp8 = MinifloatFormat::kFp8E4M3, nv = MinifloatFormat::kNvfp4;
  const alloc::KvFormatPair known[] = {{fp8, fp8}, {nv, nv}, {fp8, nv}};
  std::vector<alloc::KvFormatPair> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string name = list.substr(pos, comma - pos);
    const alloc::KvFormatPair* hit = nullptr;
    for (const auto& k : known)
      if (name == alloc::to_string(k)) hit = &k;
    if (!hit) throw Error("", flag, "unknown format '" + name + "' in '" + list + "' (valid: fp8, nvfp4, fp8_k_nvfp4_v)");
    if (std::find(out.begin(), out.end(), *hit) != out.end())
      throw Error("", flag, "format '" + name + "' given twice in '" + list + "'");
    out.push_back(*hit);
    pos = comma + 1;
  }
  return out;
}

std::vector<MinifloatFormat> side_formats(const std::vector<alloc::KvFormatPair>& pairs) {
  std::vector<MinifloatFormat> out;
  for (const auto& p : pairs)
    for (MinifloatFormat f : {p.k, p.v})
      if (std::find(out.begin(), out.end(), f) == out.end()) out.push_back(f);
  return out;
}

}  // namespace kvq
