#pragma once
// Randomized Walsh-Hadamard transform for the low-rank path: z = H P D y, with D = diag(seeded
// signs), P a fixed interleaving permutation and H block-diagonal normalized Sylvester blocks.
//
// Non-power-of-two length r: one Hadamard block per set bit of r, largest first (r = 96 -> blocks
// of 64 and 32 at offsets 0 and 64; every block's offset is a multiple of its size). Why not pad
// to the next power of two: padding stores next_pow2(r) codes per token (r = 66 would store 128),
// which breaks the solver's contract r * b <= B_h; blocks keep exactly r coordinates.
// Why the interleave P: y's coordinates are in eigen order with steeply decaying variance; filling
// blocks contiguously would give the 64-block all the large directions and the 32-block the small
// ones, and a single per-token quantizer scale fits neither (measured: +25% distortion at r = 96).
// P deals y's coordinates to the blocks in proportion to their sizes (largest deficit first), so
// every block sees nearly the same mean variance. For r a power of two, P is the identity and the
// transform is the plain randomized WHT.
// H P D is orthogonal; its inverse is D P^T H (each block is symmetric and its own inverse).
// The codec applies it once per head, folded into the basis (codec.hpp); rht_forward/inverse are
// the per-vector reference.
#include <cstdint>
#include <vector>

namespace kvq::codec {

struct HadamardBlock {
  int offset;
  int size;  // a power of two
};
std::vector<HadamardBlock> hadamard_blocks(int r);

// r signs (+1/-1) from the seed: sign k is - when bit 63 of the k-th Rng output is set.
std::vector<float> hadamard_signs(uint64_t seed, int r);

// P as a table: coordinate k of y goes to position interleave[k] of the block-ordered vector.
std::vector<int> hadamard_interleave(int r);

// Block-diagonal normalized WHT in place over r values (block order): unnormalized butterflies
// (stage h = 1, 2, 4, ...; pair (j, j+h) for (j & h) == 0) then scaling by wht_scale(block size).
void wht_inplace(float* x, int r);

// z = H P D y (y and z distinct); y = D P^T H z (z is clobbered).
void rht_forward(const float* signs, const int* interleave, const float* y, float* z, int r);
void rht_inverse(const float* signs, const int* interleave, float* z, float* y, int r);

// 1/sqrt(n) rounded once from double (sqrt is correctly rounded), so the CPU and the GPU scale by
// the same float.
inline float wht_scale(int n) { return static_cast<float>(1.0 / __builtin_sqrt(static_cast<double>(n))); }

}  // namespace kvq::codec
