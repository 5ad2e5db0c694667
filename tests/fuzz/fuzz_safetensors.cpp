// Safetensors: header length, JSON header, dtype/shape/data_offsets validation, then every float
// tensor is loaded (reads stay inside the file only if the validation is right).
#include "fuzz_common.hpp"
#include "kvq/util/error.hpp"
#include "safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = kvq_fuzz::write_scratch(".safetensors", data, size);
  try {
    kvq::detail::SafetensorsFile f(path);
    for (const auto& [name, info] : f.tensors()) {
      if (info.dtype != "F32" && info.dtype != "F16" && info.dtype != "BF16") continue;
      at::Tensor t = f.load_f32(name, info.shape);
      (void)t;
    }
  } catch (const kvq::Error&) {
  }
  return 0;
}
