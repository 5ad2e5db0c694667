// calib-capture merge (merge_calib), on a calibration file read as the merge reads it (samples
// included): merged with the seeds' tiny calibration in both orders (a mutated seed passes the
// model checks and reaches the window and corpus checks), and with a copy of itself that names
// another corpus, which every compatibility check accepts, so the held-out concatenation and the
// reservoir draw run on the input's own sizes. A merge that succeeds must write a file that reads
// back: one the tools then refuse is a finding.
#include <cstdio>

#include "fuzz_common.hpp"
#include "kvq/capture/capture.hpp"
#include "kvq/util/error.hpp"

namespace {

const kvq::CalibFile& reference() {
  static const kvq::CalibFile c = kvq::read_calib(KVQ_FUZZ_SEEDS "/calib/tiny-v1.kvqcal.h5", true);
  return c;
}

void check_merged(const kvq::CalibFile& m) {
  static const std::string out = kvq_fuzz::scratch_path(".merged.kvqcal.h5");
  try {
    kvq::write_calib(out, m);
    (void)kvq::read_calib(out, true);
  } catch (const kvq::Error& e) {
    std::fprintf(stderr, "merge wrote a file that does not read back: %s\n", e.what());
    std::abort();
  }
}

void try_merge(const kvq::CalibFile& a, const char* na, const kvq::CalibFile& b, const char* nb) {
  kvq::CalibFile m;
  try {
    m = kvq::merge_calib(a, na, b, nb);
  } catch (const kvq::Error&) {
    return;
  }
  check_merged(m);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = kvq_fuzz::write_scratch(".kvqcal.h5", data, size);
  kvq::CalibFile x;
  try {
    x = kvq::read_calib(path, true);
  } catch (const kvq::Error&) {
    return 0;
  }
  try_merge(x, "fuzz", reference(), "reference");
  try_merge(reference(), "reference", x, "fuzz");
  kvq::CalibFile y = x;
  y.prov.corpus.push_back({"other-corpus.txt", std::string(64, 'f'), 1, 0});
  try_merge(x, "fuzz", y, "fuzz-other-corpus");
  return 0;
}
