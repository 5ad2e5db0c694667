#include "kvq/model/config.hpp"

#include "kvq/util/error.hpp"

namespace kvq {

const char* to_string(RopePairing p) {
  switch (p) {
    case RopePairing::kInterleaved: return "interleaved";
    case RopePairing::kSplitHalf: return "split-half";
  }
  return "unknown";
}

RopePairing rope_pairing_from_string(const std::string& s) {
  if (s == "interleaved") return RopePairing::kInterleaved;
  if (s == "split-half") return RopePairing::kSplitHalf;
  throw Error("", "rope_pairing", "unknown value '" + s + "' (expected interleaved or split-half)");
}

}  // namespace kvq
