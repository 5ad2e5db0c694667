#pragma once
// One head of the allocation manifest (heads[i]) <-> a HeadDecision, field by field as the kind's
// row of kCodingKinds lists them (kvq/format/coding_kinds.hpp): a new kind that reuses existing
// decision fields needs nothing here. Private to lib/io (alloc_file.cpp).
#include <H5Cpp.h>

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvq/format/decision.hpp"
#include "kvq/util/error.hpp"

namespace kvq::alloc_heads {

using json = nlohmann::json;

// Integers of the manifest JSON: a float (or an integer out of T's range) is refused with the field
// named — nlohmann's get<int>() of 8e20 is undefined behaviour, not an error (found by fuzz_alloc).
template <typename T>
T int_field(const std::string& file, const json& j, const char* key) {
  const json& v = j.at(key);
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u <= uint64_t(std::numeric_limits<T>::max())) return static_cast<T>(u);
  } else if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (std::is_signed<T>::value && i >= int64_t(std::numeric_limits<T>::min()) && i <= int64_t(std::numeric_limits<T>::max()))
      return static_cast<T>(i);
  }
  throw Error(file, key, "not an integer in range: " + v.dump());
}

// The /tensors dataset of one head's array field ("k_l3_h1_basis").
std::string tensor_name(const HeadDecision& h, const char* what);

// heads[i] of a manifest of `version`; per_head_norm_correction: the TQ heads differ (version 3),
// so each records its own.
json head_json(const HeadDecision& h, int64_t version, bool per_head_norm_correction);
// The head's arrays into /tensors (low-rank basis and mean, compact ratio codebook).
void write_head_tensors(H5::Group& tensors, const HeadDecision& h, int head_dim);

struct HeadReadContext {
  const std::string& path;  // the file, for messages
  int64_t version;          // the file's version
  int head_dim, n_layers, n_kv_heads;
  bool norm_correction;     // the manifest's one value (TQ heads without their own)
  const H5::Group& tensors;
};
// heads[i] (named `where` in messages) of a file: every field of its kind, checked; throws
// kvq::Error naming the file and field (a missing or mistyped field: std::exception from nlohmann,
// which the caller names).
HeadDecision read_head(const json& j, const std::string& where, const HeadReadContext& c);

}  // namespace kvq::alloc_heads
