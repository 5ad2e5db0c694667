// kvq-probe's file (read_probe), round-tripped through probe_json when it parses: what is written
// back must read back to the same JSON.
#include "fuzz_common.hpp"
#include "kvq/io/probe_file.hpp"
#include "kvq/util/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = kvq_fuzz::write_scratch(".kvqprobe.json", data, size);
  try {
    const kvq::ProbeFile p = kvq::read_probe(path);
    const std::string again = kvq::probe_json(p).dump(1);
    const std::string& path2 = kvq_fuzz::write_scratch(".again.kvqprobe.json",
                                                       reinterpret_cast<const uint8_t*>(again.data()), again.size());
    if (kvq::probe_json(kvq::read_probe(path2)).dump(1) != again) __builtin_trap();
  } catch (const kvq::Error&) {
  }
  return 0;
}
