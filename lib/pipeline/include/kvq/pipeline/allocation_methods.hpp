#pragma once
// kvq-allocate's methods as its flags name them (allocation_methods.cpp).
#include <string>
#include <vector>

#include "kvq/alloc/layer_precision.hpp"
#include "kvq/format/decision.hpp"

namespace kvq {

// Whether kvq-allocate allocates `side` with `m`: every method but the kivi baseline for K;
// not block-gtq or cobra-kl for V (they need RoPE blocks / queries). layer-precision allocates
// both sides at once (run_allocate requires it for both).
bool allocates(Method m, Side side);
// The names allocates() accepts for a side, ", "-separated, in enum order (for help and errors).
std::string allocation_method_names(Side side);
// A --method / --v-method value: kvq::Error naming `flag` unless allocates(method, side).
Method allocation_method_from_flag(const std::string& flag, const std::string& name, Side side);
// The same check of a Method already parsed (kvq::Error naming `flag` unless allocates(m, side)).
void check_allocation_method(const std::string& flag, Method m, Side side);

// A --formats value: the per-layer (K, V) combinations layer-precision may choose, comma-separated,
// any order, no repeats: fp8 (both FP8), nvfp4 (both NVFP4), fp8_k_nvfp4_v (K FP8, V NVFP4 —
// ModelOpt's FP8_K_NVFP4_V). kvq::Error naming `flag` otherwise.
std::vector<alloc::KvFormatPair> layer_formats_from_flag(const std::string& flag, const std::string& list);
// The distinct formats the combinations use on either side, in first-use order.
std::vector<MinifloatFormat> side_formats(const std::vector<alloc::KvFormatPair>& pairs);

}  // namespace kvq
