#pragma once
// Private to lib/io: read_kvq_header's check, keeping the file open for the reader that goes on
// to read it. open_kvq_file.cpp also defines kvq_file.hpp's public functions (one home for the
// check of every kvq file).
#include <H5Cpp.h>

#include "kvq/io/kvq_file.hpp"

namespace kvq {

struct OpenedKvqFile {
  KvqFileHeader header;
  H5::H5File file;
  H5::Group root;
};

OpenedKvqFile open_kvq_file(const std::string& path, std::optional<KvqFileKind> expect);

}  // namespace kvq
