#pragma once
// The packed KV-cache layout: the one definition of the bytes of a quantized (layer, KV head, side),
// shared by the CPU codec (lib/codec) and the CUDA kernels (kernels/). Plain C++17 on fixed-size
// integers only, so nvcc compiles it for host and device. Byte-level description with a worked
// example: schemas/packed-layout.md.
//
// These numbers define bytes that live in caches and test goldens: changing any of them changes the
// format (bump kLayoutVersion and say so in schemas/packed-layout.md).
#include <stdint.h>

#include "kvq/format/hd.hpp"

namespace kvq::layout {

constexpr uint32_t kLayoutVersion = 1;

// A block's stride is rounded up to this many bytes so that every fp16 field of every block stays
// 2-byte aligned when the buffer is (plain 16-bit loads on the GPU; at most 1 byte of padding).
constexpr uint32_t kBlockAlign = 2;
constexpr uint32_t kMaxGroups = 32;  // TQ groups per head (Block-GTQ needs at most 8 widths)
constexpr uint32_t kMinBits = 1;
constexpr uint32_t kMaxBits = 8;
constexpr uint32_t kMaxHeadDim = 4096;

// Same values as kvq::CodingKind / kvq::Side (kvq/format/decision.hpp, which static_asserts it);
// kept here as integers so that nvcc compiles this header without <string> or <vector>.
constexpr uint32_t kKindTqGroups = 0;
constexpr uint32_t kKindLowRankHadamard = 1;
constexpr uint32_t kKindKivi = 2;
constexpr uint32_t kKindMinifloat = 3;
constexpr uint32_t kKindVllmTurboQuant = 4;
constexpr uint32_t kNumKinds = 5;
// The kinds the CUDA kernels code (0 .. kNumGpuKinds - 1); the others are CPU-only and refused there.
constexpr uint32_t kNumGpuKinds = 4;
constexpr uint32_t kSideK = 0;
constexpr uint32_t kSideV = 1;

// Metadata records, little-endian, at the start of a block.
struct NormRecord {  // TQ group norm rho = ||x_g||, or the low-rank latent norm ||y||
  uint16_t norm_fp16;
};
// TQ with compact group norms (PackedLayout::ratio_bits = k in 1..8): one 16-bit record per token
// instead of one fp16 norm per group, little-endian, [bits 0..15-k: the head norm's level code |
// bits 16-k..15: the index of the group-norm ratio vector]. Group g's norm decodes as
// norm_levels[level] * ratios[index * n_groups + g] (one float multiply, the same on host and
// device); both tables come with the decision (tq_compact_levels, HeadDecision::ratio_codebook).
constexpr uint32_t kCompactRecordBits = 16;
constexpr uint32_t kMaxRatioBits = 8;
static_assert(sizeof(NormRecord) == 2, "NormRecord is 2 bytes on disk");

struct KiviRecord {  // KIVI asymmetric quantizer: x_hat = code * scale + zero
  uint16_t scale_fp16;
  uint16_t zero_fp16;
};
static_assert(sizeof(KiviRecord) == 4, "KiviRecord is 4 bytes on disk");

// One TQ group as it appears in a block: its codes start code_bit_offset bits into the block's code
// stream, `dim` codes of `bits` bits each.
struct LayoutGroup {
  uint16_t dim;
  uint8_t bits;
  uint8_t reserved;
  uint32_t code_bit_offset;
};
static_assert(sizeof(LayoutGroup) == 8, "LayoutGroup must stay 8 bytes (copied to the GPU)");

// The byte layout of one (layer, KV head, side). A "block" holds tokens_per_block tokens (1 for
// every kind except KIVI K, whose scale/zero are shared by group_size consecutive tokens):
//   [meta_bytes of records][code stream: tokens_per_block x code_bits_per_token bits][pad to align]
// Codes are LSB-first little-endian with no padding between codes, groups or tokens.
struct PackedLayout {
  uint32_t kind;                 // kKind*
  uint32_t side;                 // kSide*
  uint32_t head_dim;             // d
  uint32_t code_dim;             // codes per token: d (TQ, KIVI) or the rank r (low-rank)
  uint32_t bits;                 // code width for low-rank and KIVI; 0 for TQ (per group)
  uint32_t group_size;           // KIVI: tokens (K) or channels (V) per scale/zero; else 0
  uint32_t tokens_per_block;     // 1, or group_size for KIVI K
  uint32_t n_records;            // NormRecords (TQ: n_groups, low-rank: 1) or KiviRecords
  uint32_t meta_bytes;           // bytes of records at the block start
  uint32_t code_bits_per_token;  // sum of dim*bits over the codes of one token
  uint32_t block_bytes;          // stride between blocks, a multiple of kBlockAlign
  uint32_t n_groups;             // TQ groups in `groups`; 0 otherwise
  uint32_t ratio_bits;           // TQ: 0 = one fp16 norm per group; k in 1..8 = compact record
  LayoutGroup groups[kMaxGroups];
};
static_assert(sizeof(PackedLayout) == 52 + 8 * kMaxGroups, "PackedLayout is copied to the GPU");

KVQ_HD uint32_t align_up(uint32_t n, uint32_t a) { return (n + a - 1) / a * a; }
KVQ_HD uint32_t bytes_for_bits(uint64_t bits) { return (uint32_t)((bits + 7) / 8); }

KVQ_HD PackedLayout empty_layout() {
  PackedLayout L{};
  return L;
}

KVQ_HD void finish_block(PackedLayout& L) {
  const uint64_t code_bits = (uint64_t)L.code_bits_per_token * L.tokens_per_block;
  L.block_bytes = align_up(L.meta_bytes + bytes_for_bits(code_bits), kBlockAlign);
}

// TQ-MSE on n_groups coordinate groups: records = one fp16 norm per group (group order), or with
// ratio_bits > 0 one compact 16-bit record (kCompactRecordBits); codes = group 0's dim codes, then
// group 1's, ... Preconditions (checked by the host builder in kvq/format/coding_kinds.hpp):
// 1 <= n_groups <= kMaxGroups, bits in [1, 8], sum of dims == head_dim, ratio_bits in 0..8
// (> 0 only with n_groups >= 2).
KVQ_HD PackedLayout make_tq_layout(uint32_t side, uint32_t head_dim, const uint16_t* dims,
                                   const uint8_t* bits, uint32_t n_groups, uint32_t ratio_bits = 0) {
  PackedLayout L = empty_layout();
  L.kind = kKindTqGroups;
  L.side = side;
  L.head_dim = head_dim;
  L.code_dim = head_dim;
  L.tokens_per_block = 1;
  L.n_groups = n_groups;
  L.ratio_bits = ratio_bits;
  L.n_records = ratio_bits > 0 ? 1u : n_groups;
  L.meta_bytes = L.n_records * (uint32_t)sizeof(NormRecord);
  uint32_t off = 0;
  for (uint32_t g = 0; g < n_groups; ++g) {
    L.groups[g].dim = dims[g];
    L.groups[g].bits = bits[g];
    L.groups[g].reserved = 0;
    L.groups[g].code_bit_offset = off;
    off += (uint32_t)dims[g] * bits[g];
  }
  L.code_bits_per_token = off;
  finish_block(L);
  return L;
}

// Low rank + Hadamard + uniform scalar: one fp16 norm of the latent, then `rank` codes.
KVQ_HD PackedLayout make_lrh_layout(uint32_t side, uint32_t head_dim, uint32_t rank,
                                    uint32_t bits) {
  PackedLayout L = empty_layout();
  L.kind = kKindLowRankHadamard;
  L.side = side;
  L.head_dim = head_dim;
  L.code_dim = rank;
  L.bits = bits;
  L.tokens_per_block = 1;
  L.n_records = 1;
  L.meta_bytes = (uint32_t)sizeof(NormRecord);
  L.code_bits_per_token = rank * bits;
  finish_block(L);
  return L;
}

// KIVI. K (per channel): a block is group_size tokens; records = one KiviRecord per channel
// (channel order), then the tokens' codes token-major (token t, channel c at bit (t*d + c)*bits).
// V (per token): a block is one token; records = one KiviRecord per group of group_size channels
// (the last group may be shorter), then the d codes.
KVQ_HD PackedLayout make_kivi_layout(uint32_t side, uint32_t head_dim, uint32_t bits,
                                     uint32_t group_size) {
  PackedLayout L = empty_layout();
  L.kind = kKindKivi;
  L.side = side;
  L.head_dim = head_dim;
  L.code_dim = head_dim;
  L.bits = bits;
  L.group_size = group_size;
  if (side == kSideK) {
    L.tokens_per_block = group_size;
    L.n_records = head_dim;
  } else {
    L.tokens_per_block = 1;
    L.n_records = (head_dim + group_size - 1) / group_size;
  }
  L.meta_bytes = L.n_records * (uint32_t)sizeof(KiviRecord);
  L.code_bits_per_token = head_dim * bits;
  finish_block(L);
  return L;
}

// A serving engine's minifloat (kvq::MinifloatFormat: these numbers are its values), one token per
// block, codes LSB-first (schemas/packed-layout.md, kind 3):
//  FP8 E4M3: no records, d 8-bit E4M3 codes; the static per-head scale lives in the decision.
//  NVFP4:    ceil(d/16) one-byte E4M3 block scales as the records, then d 4-bit E2M1 codes; the
//            fp32 global scale lives in the decision. group_size = 16 (channels per block scale).
constexpr uint32_t kMinifloatFp8E4M3 = 0;
constexpr uint32_t kMinifloatNvfp4 = 1;
constexpr uint32_t kNvfp4BlockValues = 16;  // = kvq::codec::kNvfp4Block
KVQ_HD PackedLayout make_minifloat_layout(uint32_t side, uint32_t head_dim, uint32_t format) {
  PackedLayout L = empty_layout();
  L.kind = kKindMinifloat;
  L.side = side;
  L.head_dim = head_dim;
  L.code_dim = head_dim;
  L.tokens_per_block = 1;
  if (format == kMinifloatFp8E4M3) {
    L.bits = 8;
  } else {
    L.bits = 4;
    L.group_size = kNvfp4BlockValues;
    L.n_records = (head_dim + kNvfp4BlockValues - 1) / kNvfp4BlockValues;
    L.meta_bytes = L.n_records;  // one E4M3 byte per block scale
  }
  L.code_bits_per_token = head_dim * L.bits;
  finish_block(L);
  return L;
}

// vLLM's TurboQuant cache, one side of the engine's slot, one token per block (schemas/packed-layout.md,
// kind 4), codes LSB-first (vLLM's 4-bit nibbles and 3-bit 24-bit words are this stream):
//  K, bits 3/4: one fp16 record (the key's norm), then d codes (Lloyd-Max, rotated).
//  K, bits 8:   no records, d FP8 E4M3 codes.
//  V, bits 3/4: one scale/zero record (fp16 scale, fp16 minimum: the KiviRecord), then d codes.
//  bits 16:     a kept layer: no records, d BF16 values as 16-bit codes.
// The engine's slot holds the same fields, each side's records after its codes (vllm_tq::Codec).
constexpr uint32_t kVllmTqKeptBits = 16;
KVQ_HD PackedLayout make_vllm_tq_layout(uint32_t side, uint32_t head_dim, uint32_t bits) {
  PackedLayout L = empty_layout();
  L.kind = kKindVllmTurboQuant;
  L.side = side;
  L.head_dim = head_dim;
  L.code_dim = head_dim;
  L.tokens_per_block = 1;
  L.bits = bits;
  if (bits <= 4) {
    L.n_records = 1;
    L.meta_bytes = side == kSideK ? (uint32_t)sizeof(NormRecord) : (uint32_t)sizeof(KiviRecord);
  }
  L.code_bits_per_token = head_dim * bits;
  finish_block(L);
  return L;
}

// Bytes holding n_tokens tokens: whole blocks (a partial KIVI K block is stored whole).
KVQ_HD uint64_t packed_bytes(const PackedLayout& L, uint64_t n_tokens) {
  const uint64_t blocks = (n_tokens + L.tokens_per_block - 1) / L.tokens_per_block;
  return blocks * L.block_bytes;
}

// Effective bits per dimension: every stored bit (records, codes, padding) per token per dim.
KVQ_HD double effective_bpd(const PackedLayout& L) {
  return (double)L.block_bytes * 8.0 / ((double)L.tokens_per_block * (double)L.head_dim);
}

// Where token `token` lives: its block's first byte and the bit offset of its codes inside that
// block's code stream (which starts meta_bytes into the block).
KVQ_HD const uint8_t* block_ptr(const PackedLayout& L, const uint8_t* base, uint64_t token) {
  return base + (token / L.tokens_per_block) * (uint64_t)L.block_bytes;
}
KVQ_HD uint32_t token_code_bit_offset(const PackedLayout& L, uint64_t token) {
  return (uint32_t)(token % L.tokens_per_block) * L.code_bits_per_token;
}

// ---- little-endian fields --------------------------------------------------------------------

KVQ_HD uint16_t load_u16le(const uint8_t* p) { return (uint16_t)(p[0] | (p[1] << 8)); }
KVQ_HD void store_u16le(uint8_t* p, uint16_t v) {
  p[0] = (uint8_t)(v & 0xff);
  p[1] = (uint8_t)(v >> 8);
}

// ---- codes: LSB-first bit stream, widths 1..8 -------------------------------------------------
// Bit k of the stream is bit (k % 8) of byte k / 8; code i of width b occupies stream bits
// [pos + i*b, pos + (i+1)*b), its least significant bit first. A code spans at most two bytes.

// ORs code v into the stream (the destination bytes must start zeroed).
KVQ_HD void put_code(uint8_t* stream, uint64_t pos, uint32_t bits, uint32_t v) {
  uint8_t* p = stream + (pos >> 3);
  const uint32_t sh = (uint32_t)(pos & 7);
  const uint32_t w = (v & ((1u << bits) - 1u)) << sh;
  p[0] = (uint8_t)(p[0] | (w & 0xff));
  if (sh + bits > 8) p[1] = (uint8_t)(p[1] | (w >> 8));
}

// Reads the code at stream bit pos; touches the second byte only when the code spans it, so a
// stream may end exactly at its last code.
KVQ_HD uint32_t get_code(const uint8_t* stream, uint64_t pos, uint32_t bits) {
  const uint8_t* p = stream + (pos >> 3);
  const uint32_t sh = (uint32_t)(pos & 7);
  uint32_t w = p[0];
  if (sh + bits > 8) w |= (uint32_t)p[1] << 8;
  return (w >> sh) & ((1u << bits) - 1u);
}

KVQ_HD void pack_codes(const uint8_t* codes, uint32_t n, uint32_t bits, uint8_t* stream,
                       uint64_t pos) {
  for (uint32_t i = 0; i < n; ++i) put_code(stream, pos + (uint64_t)i * bits, bits, codes[i]);
}

KVQ_HD void unpack_codes(const uint8_t* stream, uint64_t pos, uint32_t bits, uint32_t n,
                         uint8_t* codes) {
  for (uint32_t i = 0; i < n; ++i) codes[i] = (uint8_t)get_code(stream, pos + (uint64_t)i * bits, bits);
}

// ---- fp16 (IEEE binary16) <-> fp32, bit-exact on host and device ------------------------------

KVQ_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
#endif
}

KVQ_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
#endif
}

// Round to nearest, ties to even; overflow gives +-inf, NaN stays NaN (quiet).
KVQ_HD uint16_t f32_to_f16(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return (uint16_t)(sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (ax <= 0x33000000u) return (uint16_t)sign;              // <= 2^-25 rounds to zero
  if (ax < 0x38800000u) {                                    // half subnormal: units of 2^-24
    const uint32_t e = ax >> 23;
    const uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t s = 126u - e;  // in [14, 24]
    uint32_t q = mant >> s;
    const uint32_t rem = mant & ((1u << s) - 1u);
    const uint32_t halfway = 1u << (s - 1u);
    if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
    return (uint16_t)(sign | q);  // q == 0x400 is the smallest normal: still the right bits
  }
  uint32_t h = (((ax >> 23) - 112u) << 10) | ((ax & 0x7fffffu) >> 13);
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry correctly bumps the exponent
  return (uint16_t)(sign | h);
}

KVQ_HD float f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0) {
    if (m == 0) return f32_from_bits(sign);
    uint32_t ef = 113;  // 2^-14 with the implicit bit made explicit by the loop below
    while (!(m & 0x400u)) {
      m <<= 1;
      --ef;
    }
    return f32_from_bits(sign | (ef << 23) | ((m & 0x3ffu) << 13));
  }
  if (e == 31) return f32_from_bits(sign | 0x7f800000u | (m << 13));
  return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

constexpr float kF16Max = 65504.0f;

// ---- TQ group norms --------------------------------------------------------------------------

// Bits of the head norm's level code in a compact record.
KVQ_HD uint32_t tq_level_bits(const PackedLayout& L) { return kCompactRecordBits - L.ratio_bits; }

// Group g's norm rho~_g from the token's block: the fp16 record g, or (compact) the head norm's
// level times the ratio vector's entry g. norm_levels / ratios are unused (may be null) when
// L.ratio_bits == 0.
KVQ_HD float tq_group_norm(const PackedLayout& L, const uint8_t* blk, uint32_t g, const float* norm_levels,
                           const float* ratios) {
  if (L.ratio_bits == 0) return f16_to_f32(load_u16le(blk + 2 * g));
  const uint32_t w = load_u16le(blk);
  const uint32_t nb = tq_level_bits(L);
  return norm_levels[w & ((1u << nb) - 1u)] * ratios[(w >> nb) * L.n_groups + g];
}

}  // namespace kvq::layout
