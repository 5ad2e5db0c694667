// HF config.json: the family (families/registry.cpp) from model_type or the architectures class,
// then the family's own reading of its keys. The weights are opened in hf.cpp.
#include <string>

#include "families/family.hpp"
#include "parts/config_reader.hpp"
#include "parts/hf_json.hpp"
#include "weights.hpp"

namespace kvq::detail {

ModelConfig parse_hf_config(const std::string& path) {
  const json j = parse_json_file(path);
  const ConfigReader r(j, path);
  const Family& family = family_of_config(r);
  ModelConfig c;
  c.architecture = family.model_type;
  family.parse_config(r, &c);
  return c;
}

}  // namespace kvq::detail
