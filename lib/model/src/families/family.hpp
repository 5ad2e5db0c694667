#pragma once
// One home per model family. A family is one row of the table in registry.cpp: the HF `model_type`
// and `architectures` classes it answers to, how its config.json reads into a ModelConfig, the
// names and shapes of its checkpoint's tensors, the checks of its weights against its config, and
// the layer it computes. Each family lives in families/<family>.{hpp,cpp}; what several families
// share (config reading, tensor layouts, attention, RoPE, norms, MoE routers, MLA) lives once in
// parts/. A new family is one file pair here plus one row in the table.
#include <string>
#include <vector>

#include "kvq/model/config.hpp"
#include "parts/config_reader.hpp"
#include "parts/decoder_layer.hpp"
#include "parts/layout.hpp"

namespace kvq::detail {

struct Family {
  const char* model_type;            // config.json's model_type (what ModelConfig::architecture holds)
  std::vector<const char*> classes;  // the `architectures` classes that mean it when model_type is absent
  // config.json's keys into c (c->architecture already set); throws kvq::Error naming file and key.
  void (*parse_config)(const ConfigReader& r, ModelConfig* c);
  // The embedding, final norm and LM head tensors (t: the checkpoint's tensors, for a family whose
  // names depend on how it was saved, e.g. Gemma 3's multimodal prefixes; empty when only sizes are asked).
  GlobalNames (*global_names)(const ModelConfig& c, const TensorIndex& t);
  // Checks of the weights against config.json that name the config key (an expert count, a fused
  // projection's rows, a latent width), run before any tensor's own shape check; may be null.
  void (*check_weights)(const ModelConfig& c, const TensorIndex& t, const std::string& config_path);
  // Decoder layer l's tensors and the LayerWeights they fill, in check order. `t` is empty when only
  // sizes are asked (Model::whole_fp32_bytes before anything is opened).
  LayerPlan (*layer_plan)(const ModelConfig& c, int l, const TensorIndex& t);
  // The layer the forward runs.
  LayerFn layer;
};

// The family of an HF config: model_type, or else the first `architectures` class. A family kvq
// does not open is refused in one line that names the key, the value and, where known, why.
const Family& family_of_config(const ConfigReader& r);
// The family registered under model_type `architecture`, or nullptr (llama2.c checkpoints).
const Family* find_family(const std::string& architecture);

}  // namespace kvq::detail
