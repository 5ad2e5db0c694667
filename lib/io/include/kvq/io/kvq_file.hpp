#pragma once
// Which kvq file a path holds: the one place that opens a calibration (.kvqcal.h5) or allocation
// (.kvqalloc.h5) file and checks its root @format and @version (schemas/calibration-file.md,
// schemas/allocation-file.md). The readers and kvq-inspect go through it, so every tool refuses a
// foreign, future or corrupt file with the same one-line message.
#include <cstdint>
#include <optional>
#include <string>

namespace kvq {

enum class KvqFileKind { kCalibration, kAllocation };

const char* format_name(KvqFileKind kind);  // the @format value: "kvq-calibration", "kvq-allocation"

struct KvqFileHeader {
  KvqFileKind kind = KvqFileKind::kCalibration;
  int64_t version = 0;  // within the versions this kvq reads for that kind
};

// Opens `path`, reads @format and @version once and checks them: a kvq format (`expect`, when
// given), a version this kvq reads. Throws kvq::Error of one line naming the file, the field and
// the value found for anything else, HDF5's own failures (not-HDF5, truncated, corrupt) included.
KvqFileHeader read_kvq_header(const std::string& path, std::optional<KvqFileKind> expect = std::nullopt);

}  // namespace kvq
