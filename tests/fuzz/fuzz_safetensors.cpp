// Safetensors: header length, JSON header, dtype/shape/data_offsets validation, then every float
// tensor is converted to fp32 (reads stay inside the file only if the validation is right). Uses
// read_f32, the torch-free half of load_f32, so this target builds without LibTorch.
#include <vector>

#include "fuzz_common.hpp"
#include "kvq/util/error.hpp"
#include "safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = kvq_fuzz::write_scratch(".safetensors", data, size);
  try {
    kvq::detail::SafetensorsFile f(path);
    std::vector<float> out;
    for (const auto& [name, info] : f.tensors()) {
      if (info.dtype != "F32" && info.dtype != "F16" && info.dtype != "BF16") continue;
      f.check(name, info.shape);
      // numel from the byte span: the header check guarantees it equals the product of the shape.
      const int64_t n = int64_t((info.end - info.begin) / (info.dtype == "F32" ? 4 : 2));
      out.resize(size_t(n));
      // Two ranges, as load_f32's parallel_for would split it.
      f.read_f32(name, 0, n / 2, out.data());
      f.read_f32(name, n / 2, n, out.data() + n / 2);
    }
  } catch (const kvq::Error&) {
  }
  return 0;
}
