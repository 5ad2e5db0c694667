// The JSON provenance manifest stored in calibration files (provenance_from_json), round-tripped
// through provenance_to_json when it parses.
#include <string>

#include "kvq/io/calib_file.hpp"
#include "kvq/util/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    kvq::CalibProvenance p = kvq::provenance_from_json("fuzz.kvqcal.h5", text);
    const std::string again = kvq::provenance_to_json(p);
    kvq::CalibProvenance q = kvq::provenance_from_json("fuzz.kvqcal.h5", again);
    if (kvq::provenance_to_json(q) != again) __builtin_trap();
  } catch (const kvq::Error&) {
  }
  return 0;
}
