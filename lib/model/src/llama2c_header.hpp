#pragma once
// Internal: the llama2.c header reader over an already mapped file (llama2c_header.cpp), shared
// by the torch-free kvq::llama2c_config and the weight loader (llama2c.cpp).
#include <string>

#include "kvq/model/config.hpp"
#include "mapped_file.hpp"

namespace kvq::detail {
ModelConfig llama2c_header_config(const MappedFile& f, std::string* config_sha256);
}  // namespace kvq::detail
