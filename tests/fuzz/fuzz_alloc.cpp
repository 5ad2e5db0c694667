// Allocation HDF5 file (read_alloc).
#include "fuzz_common.hpp"
#include "kvq/io/alloc_file.hpp"
#include "kvq/util/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = kvq_fuzz::write_scratch(".kvqalloc.h5", data, size);
  try {
    kvq::AllocFile a = kvq::read_alloc(path);
    (void)kvq::alloc_manifest(a).dump();
  } catch (const kvq::Error&) {
  }
  return 0;
}
