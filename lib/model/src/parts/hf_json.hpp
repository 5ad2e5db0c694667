#pragma once
// A JSON object read from a file of an HF checkpoint (config.json, the shard index); errors name
// the file. Shared by the config reader (hf_config.cpp) and the checkpoint opener (hf.cpp).
#include <string>

#include <nlohmann/json.hpp>

namespace kvq::detail {
nlohmann::json parse_json_file(const std::string& path);
}  // namespace kvq::detail
