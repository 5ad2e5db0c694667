// Calibration HDF5 file (read_calib, with samples): HDF5 itself parses the container, then kvq
// validates format/version/provenance/shapes before allocating.
#include "fuzz_common.hpp"
#include "kvq/io/calib_file.hpp"
#include "kvq/util/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = kvq_fuzz::write_scratch(".kvqcal.h5", data, size);
  try {
    kvq::CalibFile c = kvq::read_calib(path, /*samples=*/true);
    (void)kvq::calib_content_digest(c);
  } catch (const kvq::Error&) {
  }
  return 0;
}
