#pragma once
// Safetensors reader: 8-byte little-endian header length, JSON header, raw data. The whole header
// is validated on open (length against file size, every tensor's dtype, shape and data_offsets), so
// loading a tensor afterwards cannot read outside the file. Torch-free, so the fuzz targets build
// it without LibTorch; load_f32, the one function making an at::Tensor, is safetensors_load.cpp.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mapped_file.hpp"

namespace at {
class Tensor;  // complete wherever load_f32 is called (weights.hpp includes ATen)
}

namespace kvq::detail {

struct StTensorInfo {
  std::string dtype;            // safetensors dtype name, e.g. "F32", "F8_E4M3", "U8", "I32"
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range relative to the data section
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // throws kvq::Error

  const std::string& path() const { return file_.path(); }
  const StTensorInfo* find(const std::string& name) const;
  const std::map<std::string, StTensorInfo>& tensors() const { return tensors_; }

  // Checks that `name` exists, has a loadable float dtype (F32/F16/BF16) and the expected shape;
  // throws kvq::Error naming this file, the tensor and what was found.
  void check(const std::string& name, const std::vector<int64_t>& shape) const;
  // Elements [begin, end) of tensor `name`, converted to fp32, into dst[0, end - begin). The tensor
  // must have passed check() (a float dtype) and the range must lie inside it: anything else is a
  // caller bug (KVQ_ASSERT), not bad input. The ranges let load_f32 convert in parallel.
  void read_f32(const std::string& name, int64_t begin, int64_t end, float* dst) const;
  // Hands the pages of tensor `name` back to the kernel (MappedFile::drop); no-op if absent.
  void drop(const std::string& name) const;
  // Maps tensor `name`'s pages in one call before it is read (MappedFile::prefault); no-op if absent.
  void prefault(const std::string& name) const;
  // The same for bytes [begin, begin + len) of the tensor (one expert of a stacked tensor).
  void drop(const std::string& name, uint64_t begin, uint64_t len) const;
  void prefault(const std::string& name, uint64_t begin, uint64_t len) const;
  // Bytes tensor `name` occupies in the file (0 if absent).
  uint64_t stored_bytes(const std::string& name) const;
  // The stored bytes of tensor `name`, any dtype (F8_E4M3, U8, I32, ...): stored_bytes(name) of
  // little-endian data, not necessarily aligned (read with memcpy). For the quantized-weight
  // decoders (parts/quant.cpp); the header check guarantees the span matches dtype and shape. The
  // tensor must exist (KVQ_ASSERT): find() first.
  const uint8_t* raw_bytes(const std::string& name) const;
  // check() then a new fp32 tensor with the converted contents (safetensors_load.cpp, LibTorch).
  at::Tensor load_f32(const std::string& name, const std::vector<int64_t>& shape) const;

 private:
  MappedFile file_;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::map<std::string, StTensorInfo> tensors_;
};

std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace kvq::detail
