#pragma once
#include <functional>
#include <string>

namespace kvq {

// Writes `path` atomically: the writer fills `<path>.tmp.<pid>`, which is fsync'ed and renamed over
// `path`. If the writer throws, the temporary is removed and nothing appears at `path`; if SIGINT,
// SIGTERM or SIGHUP ends the process while it is written (and no other handler is installed for
// that signal), a handler removes it before the process dies of the signal.
void write_atomically(const std::string& path, const std::function<void(const std::string& tmp_path)>& writer);

// Convenience for small text/binary payloads.
void write_file_atomically(const std::string& path, const std::string& bytes);

std::string read_file(const std::string& path);  // throws kvq::Error naming the file

}  // namespace kvq
