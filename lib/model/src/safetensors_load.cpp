// The LibTorch half of the safetensors reader (kept apart so safetensors.cpp builds without it).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "safetensors.hpp"

namespace kvq::detail {

at::Tensor SafetensorsFile::load_f32(const std::string& name, const std::vector<int64_t>& shape) const {
  check(name, shape);
  at::Tensor out = at::empty(shape, at::kFloat);
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, out.numel(), 1 << 16,
                   [&](int64_t b, int64_t e) { read_f32(name, b, e, dst + b); });
  return out;
}

}  // namespace kvq::detail
