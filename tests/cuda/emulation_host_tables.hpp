#pragma once
// Host "uploads" for kernels run by cuda_emulation.hpp: the emulated kernels read host memory, so
// an upload keeps its copy alive for the tables' lifetime and hands back its address. Include after
// cuda_emulation.hpp and kvq/cuda/decode_kernels.cuh (the emulation must precede the kernels).
#include <cstdint>
#include <deque>
#include <vector>

#include "kvq/codec/codec.hpp"
#include "kvq/cuda/decode_kernels.cuh"

namespace kvq::cuda::detail {

struct HostTables {
  std::deque<std::vector<float>> f;
  std::deque<std::vector<int32_t>> i;
  std::deque<std::vector<uint8_t>> u;
  const float* up(const std::vector<float>& v) { return f.emplace_back(v).data(); }
  const int32_t* up(const std::vector<int32_t>& v) { return i.emplace_back(v).data(); }
  const uint8_t* up(const std::vector<uint8_t>& v) { return u.emplace_back(v).data(); }
  DevHead head(const codec::HeadCodec& c) {
    return make_dev_head(c, [this](const auto& v) { return up(v); });
  }
};

}  // namespace kvq::cuda::detail
