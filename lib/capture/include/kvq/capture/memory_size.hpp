#pragma once
// --max-memory: its parser and its default.
#include <cstdint>
#include <string>

namespace kvq {

// "6G", "1500M", "512k", "123456" (bytes; K/M/G/T are powers of 1024) -> bytes. Throws kvq::Error
// naming `field` on anything else.
int64_t parse_memory_size(const std::string& text, const std::string& field);
// The default --max-memory: 80 % of MemAvailable, or of the cgroup's room when that is smaller.
int64_t default_memory_budget();

}  // namespace kvq
