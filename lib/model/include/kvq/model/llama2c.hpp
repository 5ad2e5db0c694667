#pragma once
// The configuration of a llama2.c legacy ("v0") checkpoint from its 7-field header, checked against
// the file's size — without reading or converting any weight, and without LibTorch (kvq-tokenize
// needs only the vocabulary size to find tok<N>.bin). Model::load reads the same header.
#include <string>

#include "kvq/model/config.hpp"

namespace kvq {

// Throws kvq::Error naming the file and the header field. config_sha256 (optional): the sha256 of
// the header, which is what a llama2.c checkpoint's config is.
ModelConfig llama2c_config(const std::string& path, std::string* config_sha256 = nullptr);

}  // namespace kvq
