#include "kvq/export/safetensors_writer.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>

#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"

namespace kvq::exporter {

// Element bytes are copied from memory as they are: the format is little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors_writer assumes a little-endian host");

namespace {

size_t dtype_size(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2") return 1;
  return 0;
}

}  // namespace

StTensor f32_tensor(const std::string& name, const std::vector<int64_t>& shape, const std::vector<float>& values) {
  StTensor t;
  t.name = name;
  t.dtype = "F32";
  t.shape = shape;
  t.bytes.resize(values.size() * sizeof(float));
  if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

std::string safetensors_bytes(const std::vector<StTensor>& tensors, const std::map<std::string, std::string>& metadata) {
  std::vector<const StTensor*> order;
  std::set<std::string> names;
  for (const auto& t : tensors) {
    // Callers build these from validated inputs: a bad tensor here is a bug, not bad input.
    KVQ_ASSERT(!t.name.empty() && t.name != "__metadata__");
    KVQ_ASSERT(names.insert(t.name).second);
    const size_t es = dtype_size(t.dtype);
    KVQ_ASSERT(es > 0);
    uint64_t n = 1;
    for (int64_t s : t.shape) {
      KVQ_ASSERT(s >= 0);
      n *= uint64_t(s);
    }
    KVQ_ASSERT(n * es == t.bytes.size());
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](const StTensor* a, const StTensor* b) { return a->name < b->name; });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  uint64_t offset = 0;
  for (const StTensor* t : order) {
    nlohmann::ordered_json e;
    e["dtype"] = t->dtype;
    e["shape"] = t->shape;
    e["data_offsets"] = {offset, offset + t->bytes.size()};
    header[t->name] = e;
    offset += t->bytes.size();
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');

  std::string out;
  out.reserve(8 + h.size() + offset);
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out.push_back(char((n >> (8 * i)) & 0xff));
  out += h;
  for (const StTensor* t : order) out += t->bytes;
  return out;
}

void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_file_atomically(path, safetensors_bytes(tensors, metadata));
}

}  // namespace kvq::exporter
