#pragma once
// Reading a packed code stream fast (every kind's CPU decoder): width-specialised loops over runs of
// codes. Private to lib/codec.
#include <cstdint>
#include <cstring>

#include "kvq/format/packed_layout.hpp"
#include "kvq/util/error.hpp"

namespace kvq::codec::detail {

using layout::get_code;

// Calls f(i, code_i) for n codes of width B from stream bit pos, reading no byte at or beyond
// `end`. The hot loop takes one unaligned 64-bit little-endian load per floor(57 / B) codes
// (57 = 64 - 7 bits of start offset); the tail and big-endian hosts use the portable get_code.
template <uint32_t B, class F>
inline void for_each_code(const uint8_t* stream, uint64_t pos, uint32_t n, const uint8_t* end, F&& f) {
  uint32_t i = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  constexpr uint32_t kPer = 57 / B;
  constexpr uint64_t kMask = (uint64_t{1} << B) - 1;
  while (i + kPer <= n && stream + (pos >> 3) + 8 <= end) {
    uint64_t v;
    std::memcpy(&v, stream + (pos >> 3), 8);
    v >>= (pos & 7);
#pragma GCC unroll 64
    for (uint32_t j = 0; j < kPer; ++j) f(i + j, static_cast<uint32_t>((v >> (j * B)) & kMask));
    i += kPer;
    pos += uint64_t{kPer} * B;
  }
#endif
  for (; i < n; ++i, pos += B) f(i, get_code(stream, pos, B));
}

// Dispatches a run of width `bits` to the width-specialised loop.
template <class F>
inline void for_each_code(const uint8_t* stream, uint64_t pos, uint32_t bits, uint32_t n,
                          const uint8_t* end, F&& f) {
  switch (bits) {
    case 1: return for_each_code<1>(stream, pos, n, end, f);
    case 2: return for_each_code<2>(stream, pos, n, end, f);
    case 3: return for_each_code<3>(stream, pos, n, end, f);
    case 4: return for_each_code<4>(stream, pos, n, end, f);
    case 5: return for_each_code<5>(stream, pos, n, end, f);
    case 6: return for_each_code<6>(stream, pos, n, end, f);
    case 7: return for_each_code<7>(stream, pos, n, end, f);
    case 8: return for_each_code<8>(stream, pos, n, end, f);
  }
  KVQ_ASSERT(false);
}

inline void unpack_run(const uint8_t* stream, uint64_t pos, uint32_t bits, uint32_t n, const uint8_t* end,
                uint8_t* out) {
  for_each_code(stream, pos, bits, n, end, [out](uint32_t i, uint32_t c) { out[i] = static_cast<uint8_t>(c); });
}

}  // namespace kvq::codec::detail
