#pragma once
// The tables a TQ group is coded with (HeadCodec::tq_groups(); the CUDA side uploads exactly these).
#include <cstdint>
#include <memory>
#include <vector>

#include "kvq/codec/rotation.hpp"

namespace kvq::codec {

struct TqGroupTables {
  std::vector<int> dims;             // head coordinates, code order
  int bits = 0;
  uint32_t latent_offset = 0;        // first code/latent index of the group
  std::shared_ptr<const Rotation> rotation;
  std::vector<float> centroids;      // 2^bits: N(0, 1/m) or the sphere law (group_codebook)
  std::vector<float> thresholds;     // 2^bits - 1
};

}  // namespace kvq::codec
