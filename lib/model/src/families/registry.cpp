// The table of model families: model_type -> its home (families/<family>.{hpp,cpp}), and the
// families kvq refuses with why. The order of the rows is the order the "supported:" list names.
#include <map>
#include <string>

#include "deepseek.hpp"
#include "family.hpp"
#include "gemma3.hpp"
#include "glm.hpp"
#include "glm4_moe.hpp"
#include "gpt_oss.hpp"
#include "llama.hpp"
#include "mistral.hpp"
#include "qwen.hpp"
#include "qwen3_5.hpp"

namespace kvq::detail {
namespace {

const std::vector<const Family*>& table() {
  static const std::vector<const Family*> rows = {&kLlamaFamily,   &kMistralFamily, &kQwen2Family, &kQwen3Family,
                                                  &kQwen3MoeFamily, &kMixtralFamily, &kChatGlmFamily, &kGlmFamily,
                                                  &kGlm4Family,    &kDeepseekV2Family, &kDeepseekV3Family,
                                                  &kKimiK2Family,  &kGlm4MoeFamily, &kGptOssFamily,
                                                  &kGemma3Family, &kGemma3TextFamily, &kQwen3_5Family,
                                                  &kQwen3_5MoeFamily, &kQwen3_5TextFamily, &kQwen3_5MoeTextFamily,
                                                  &kQwen3NextFamily};
  return rows;
}

// Families whose math differs from everything above, refused by model_type with the reason.
struct Refused {
  const char* model_type;
  std::vector<const char*> classes;
  const char* why;
};
const std::vector<Refused>& refused() {
  static const std::vector<Refused> rows = {
      {"deepseek_v32", {"DeepseekV32ForCausalLM"},
       "DeepSeek-V3.2's sparse attention keeps a second cache (the DSA indexer's FP8 keys) that kvq does not model"},
      {"deepseek_v4", {"DeepseekV4ForCausalLM"}, "DeepSeek-V4's attention and cache layout are not implemented"},
      {"glm_moe_dsa", {"GlmMoeDsaForCausalLM"},
       "GLM-5's DeepSeek sparse attention keeps a second (indexer) cache that kvq does not model"},
      {"gemma", {"GemmaForCausalLM"}, "(1 + w) RMSNorm, GeGLU MLP and scaled embeddings are not implemented"},
      {"gemma2", {"Gemma2ForCausalLM"}, "(1 + w) RMSNorm, GeGLU MLP and logit softcapping are not implemented"},
      {"gemma4", {"Gemma4ForConditionalGeneration"},
       "Gemma 4's full layers share K and V (attention_k_eq_v) with their own head dim and proportional RoPE, and "
       "its KV-shared layers keep no cache: not implemented"},
      {"gemma4_text", {"Gemma4ForCausalLM"},
       "Gemma 4's full layers share K and V (attention_k_eq_v) with their own head dim and proportional RoPE, and "
       "its KV-shared layers keep no cache: not implemented"},
      {"phi3", {"Phi3ForCausalLM"}, "LongRoPE scaling and the fused qkv_proj / gate_up_proj layout are not implemented"},
      {"qwen2_moe", {"Qwen2MoeForCausalLM"}, "shared experts with a sigmoid shared-expert gate are not implemented"}};
  return rows;
}

std::string supported_list() {
  std::string s = " (supported: ";
  for (size_t i = 0; i < table().size(); ++i) s += (i ? ", " : "") + std::string(table()[i]->model_type);
  return s + ")";
}

}  // namespace

const Family* find_family(const std::string& architecture) {
  for (const Family* f : table())
    if (architecture == f->model_type) return f;
  return nullptr;
}

const Family& family_of_config(const ConfigReader& r) {
  const std::string& path = r.path();
  const json& j = r.json_object();
  auto refuse = [&](const char* field, const std::string& name, const std::string& mt) {
    for (const Refused& x : refused())
      if (mt == x.model_type)
        throw Error(path, field, "'" + name + "' is not supported: " + x.why + supported_list());
    throw Error(path, field, "unsupported architecture '" + name + "'" + supported_list());
  };
  const std::string mt = r.string("model_type");
  if (!mt.empty()) {
    if (const Family* f = find_family(mt)) return *f;
    refuse("model_type", mt, mt);
  }
  if (r.has("architectures")) {
    const json& a = j["architectures"];
    if (a.is_array() && !a.empty() && a[0].is_string()) {
      const std::string cls = a[0].get<std::string>();
      for (const Family* f : table())
        for (const char* k : f->classes)
          if (cls == k) return *f;
      std::string refused_mt;
      for (const Refused& x : refused())
        for (const char* k : x.classes)
          if (cls == k) refused_mt = x.model_type;
      refuse("architectures", cls, refused_mt);
    }
    throw Error(path, "architectures", "expected a list of class names, found " + a.dump());
  }
  throw Error(path, "model_type", "missing (and no architectures list)");
}

}  // namespace kvq::detail
