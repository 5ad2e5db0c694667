#pragma once
// The RoPE pairing: which two coordinates of a head vector one rotation (a "RoPE block") turns.
// The one definition shared by the forward (lib/model), the statistics, Block-GTQ's groups, the
// codec's post-RoPE coding and the CUDA kernels. Written to disk (calibration and allocation files,
// by name): never renumber or rename.
#include <math.h>
#include <stdint.h>

#include "kvq/format/hd.hpp"

#if !defined(__CUDACC__)
#include <string>

#include "kvq/util/error.hpp"
#endif

namespace kvq {

enum class RopePairing : uint32_t {
  kInterleaved = 0,  // block i = coords (2i, 2i+1)       — Meta / llama2.c
  kSplitHalf = 1,    // block i = coords (i, i + d_r/2)   — HF rotate_half
};

// Rotated block i < d_r/2 of a head with rotary dim d_r turns coordinates a = stride·i and
// b = stride·i + partner (interleaved: stride 2, partner 1; split-half: stride 1, partner d_r/2).
struct RopeStride {
  int stride;
  int partner;
};
KVQ_HD RopeStride rope_stride(RopePairing p, int rotary_dim) {
  return p == RopePairing::kInterleaved ? RopeStride{2, 1} : RopeStride{1, rotary_dim / 2};
}

// Coordinates (a, b) of RoPE block i for a head of dimension d with rotary dim d_r. Blocks at or
// past d_r/2 are the unrotated tail, paired in the same convention over the tail dims.
KVQ_HD void rope_block_coords(RopePairing p, int d, int d_r, int i, int* a, int* b) {
  const int nr = d_r / 2;
  const bool tail = i >= nr;
  const int j = tail ? i - nr : i;
  const RopeStride s = rope_stride(p, tail ? d - d_r : d_r);
  *a = (tail ? d_r : 0) + s.stride * j;
  *b = *a + s.partner;
}

// The default (unscaled) inverse frequency of RoPE block i: theta^(-2i/d_r), in double. The
// model's frequency table, the codec's reference RoPE and the CUDA kernels' plan all take it from
// here, so their angles are the same bits.
KVQ_HD double rope_block_default_inv_freq(double theta, int i, int rotary_dim) {
  return ::pow(theta, -2.0 * double(i) / double(rotary_dim));
}

// Turns the pair (xa, xb) of one RoPE block by the angle whose cosine c and sine s are given (the
// attention factor, and for the inverse the sign, already folded in): (ya, yb) = R(angle)·(xa, xb).
// T = float in the forward (lib/model), double in the reference (lib/codec) and the CUDA kernels;
// every RoPE goes through this one expression so that their operation order is the same.
template <typename T>
KVQ_HD void rope_rotate_pair(T xa, T xb, T c, T s, T* ya, T* yb) {
  *ya = xa * c - xb * s;
  *yb = xa * s + xb * c;
}

#if !defined(__CUDACC__)
inline const char* to_string(RopePairing p) {
  switch (p) {
    case RopePairing::kInterleaved: return "interleaved";
    case RopePairing::kSplitHalf: return "split-half";
  }
  return "unknown";
}

// Throws kvq::Error naming the field.
inline RopePairing rope_pairing_from_string(const std::string& s) {
  if (s == "interleaved") return RopePairing::kInterleaved;
  if (s == "split-half") return RopePairing::kSplitHalf;
  throw Error("", "rope_pairing", "unknown value '" + s + "' (expected interleaved or split-half)");
}
#endif

}  // namespace kvq
