#pragma once
#include <functional>
#include <string>

namespace kvq {

// Writes `path` atomically: the writer fills `<path>.tmp.<pid>`, which is fsync'ed and renamed over
// `path`. If the writer throws, the temporary is removed and nothing appears at `path`.
void write_atomically(const std::string& path, const std::function<void(const std::string& tmp_path)>& writer);

// Convenience for small text/binary payloads.
void write_file_atomically(const std::string& path, const std::string& bytes);

std::string read_file(const std::string& path);  // throws kvq::Error naming the file

}  // namespace kvq
