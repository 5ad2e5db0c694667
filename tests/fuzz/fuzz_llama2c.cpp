// llama2.c legacy checkpoint: 7 int32 header fields, then fp32 arrays whose total must match the
// file size exactly.
#include "fuzz_common.hpp"
#include "kvq/util/error.hpp"
#include "weights.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = kvq_fuzz::write_scratch(".bin", data, size);
  try {
    kvq::ModelConfig cfg;
    kvq::ModelWeights w;
    std::string sha;
    kvq::detail::load_llama2c(path, &cfg, &w, &sha);
  } catch (const kvq::Error&) {
  }
  return 0;
}
