#pragma once
// Safetensors writer (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON header {name: {dtype, shape, data_offsets: [begin, end]}, optional
// "__metadata__": {string: string}}, padded with spaces so the data starts 8-byte aligned, then the
// tensors' bytes back to back (offsets relative to the data section). The reader is lib/model's.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kvq::exporter {

struct StTensor {
  std::string name;
  std::string dtype = "F32";     // only F32 is produced; the writer checks bytes against shape
  std::vector<int64_t> shape;
  std::string bytes;             // little-endian element data, row-major
};

StTensor f32_tensor(const std::string& name, const std::vector<int64_t>& shape, const std::vector<float>& values);

// The whole file as bytes. Tensors are written in name order (the header's JSON object order), so
// the output does not depend on the order given. Names must be unique and not "__metadata__".
std::string safetensors_bytes(const std::vector<StTensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// Atomic (kvq::write_atomically): nothing appears at `path` on error.
void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace kvq::exporter
