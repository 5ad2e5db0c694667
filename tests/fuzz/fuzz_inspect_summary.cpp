// kvq-inspect's summaries (run_inspect without figures or output files, and the tables and
// spectra the figures draw from): a calibration file; an allocation file, with the seeds' tiny
// calibration as --calib (a mutated seed allocation passes the model check and reaches the
// before-C2 recomputation with the solver parameters the file records), without it, and compared
// with itself.
#include <cstdio>

#include "fuzz_common.hpp"
#include "kvq/report/inspect.hpp"
#include "kvq/report/summary.hpp"
#include "kvq/util/error.hpp"

namespace {

std::FILE* sink() {
  static std::FILE* f = std::fopen("/dev/null", "w");
  return f;
}

void inspect(const std::vector<std::string>& files, const std::string& calib) {
  kvq::report::InspectOptions o;
  o.files = files;
  o.calib = calib;
  try {
    (void)kvq::report::run_inspect(o, sink());
  } catch (const kvq::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = kvq_fuzz::write_scratch(".kvqinspect.h5", data, size);
  kvq::report::FileKind kind;
  try {
    kind = kvq::report::detect_kind(path);
  } catch (const kvq::Error&) {
    return 0;
  }
  if (kind == kvq::report::FileKind::kCalibration) {
    inspect({path}, "");
    try {
      const kvq::CalibFile c = kvq::read_calib(path, false);
      (void)kvq::report::calib_tables(c);
      (void)kvq::report::calib_summary_json(c, path).dump();
      if (c.prov.n_layers > 0 && c.prov.n_kv_heads > 0) (void)kvq::report::eigen_spectra(c, 0, 0);
    } catch (const kvq::Error&) {
    }
    return 0;
  }
  inspect({path}, KVQ_FUZZ_SEEDS "/calib/tiny-v1.kvqcal.h5");
  inspect({path, path}, "");
  try {
    const kvq::AllocFile a = kvq::read_alloc(path);
    (void)kvq::report::alloc_summary_text(a, path, nullptr);
    (void)kvq::report::alloc_tables(a, nullptr);
    for (kvq::Side s : {kvq::Side::kK, kvq::Side::kV}) (void)kvq::report::fingerprint(a, s);
  } catch (const kvq::Error&) {
  }
  return 0;
}
