// Loading and validating tokenizer.json: model (vocab, merges), added tokens, normalizer,
// pre-tokenizer and decoder config, the post-processor's BOS and tokenizer_config.json's BOS rule.
// Everything unsupported or broken is a kvq::Error naming the file, the field and the value.
#include <algorithm>
#include <filesystem>
#include <functional>

#include "kvq/util/atomic_file.hpp"
#include "kvq/util/sha256.hpp"
#include "tokenizer_json_internal.hpp"

namespace fs = std::filesystem;

namespace kvq {
namespace tokjson {

ByteLevelBpeTokenizer::ByteLevelBpeTokenizer(const std::string& path, const std::string& bytes) {
  path_ = path;
  sha256_ = sha256_hex(bytes.data(), bytes.size());
  json j;
  try {
    j = json::parse(bytes);
  } catch (const json::exception& e) {
    throw Error(path, "", std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw Error(path, "", "not a JSON object");
  parse_model(j);
  parse_added_tokens(j);
  parse_normalizer(j);
  parse_pre_tokenizer(j);
  parse_decoder(j);
  parse_post_processor(j);
  parse_config();
}

// ---- loading ----
void ByteLevelBpeTokenizer::parse_model(const json& j) {
  if (!j.contains("model") || !j["model"].is_object()) throw Error(path_, "model", "missing (no model object)");
  const json& m = j["model"];
  const std::string type = m.contains("type") && m["type"].is_string() ? m["type"].get<std::string>() : "";
  if (type != "BPE") {
    if (type.empty() && m.contains("merges") && m.contains("vocab")) {
      // Old files leave model.type out for BPE.
    } else {
      throw Error(path_, "model.type",
                  (type.empty() ? std::string("missing") : "'" + type + "'") +
                      " is not supported (kvq reads byte-level BPE tokenizer.json only)");
    }
  }
  auto str_or_empty = [&](const char* f) {
    if (!m.contains(f) || m[f].is_null()) return std::string();
    if (!m[f].is_string()) throw Error(path_, std::string("model.") + f, "not a string");
    return m[f].get<std::string>();
  };
  if (!str_or_empty("continuing_subword_prefix").empty())
    throw Error(path_, "model.continuing_subword_prefix", "non-empty prefix is not supported");
  if (!str_or_empty("end_of_word_suffix").empty())
    throw Error(path_, "model.end_of_word_suffix", "non-empty suffix is not supported");
  if (m.contains("byte_fallback") && m["byte_fallback"].is_boolean() && m["byte_fallback"].get<bool>())
    throw Error(path_, "model.byte_fallback", "true is not supported (byte-level BPE has no byte fallback)");
  if (m.contains("dropout") && m["dropout"].is_number() && m["dropout"].get<double>() > 0.0)
    throw Error(path_, "model.dropout", std::to_string(m["dropout"].get<double>()) + " (BPE dropout is random; not supported)");
  ignore_merges_ = m.contains("ignore_merges") && m["ignore_merges"].is_boolean() && m["ignore_merges"].get<bool>();

  if (!m.contains("vocab") || !m["vocab"].is_object()) throw Error(path_, "model.vocab", "missing or not an object");
  const json& vocab = m["vocab"];
  if (vocab.empty()) throw Error(path_, "model.vocab", "empty");
  int max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it)
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() > (1 << 24))
      throw Error(path_, "model.vocab[" + json(it.key()).dump() + "]", "id " + it.value().dump() + " is not an id in [0, 2^24]");
    else
      max_id = std::max(max_id, it.value().get<int>());
  decode_bytes_.assign(size_t(max_id) + 1, "");
  has_id_.assign(size_t(max_id) + 1, 0);
  raw_to_id_.reserve(vocab.size() * 2);
  std::string raw;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int id = it.value().get<int>();
    has_id_[size_t(id)] = 1;
    if (byte_level_to_raw(it.key(), &raw)) {
      decode_bytes_[size_t(id)] = raw;
      raw_to_id_.emplace(raw, id);
    } else {
      decode_bytes_[size_t(id)] = it.key();  // unreachable by encode; decodes as written
    }
  }
  for (int b = 0; b < 256; ++b) {
    auto it = raw_to_id_.find(std::string(1, char(b)));
    byte_id_[size_t(b)] = it == raw_to_id_.end() ? -1 : it->second;
  }

  if (!m.contains("merges") || !m["merges"].is_array()) throw Error(path_, "model.merges", "missing or not an array");
  const json& merges = m["merges"];
  merges_.reserve(merges.size() * 2);
  std::string a, b, ra, rb;
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& e = merges[i];
    const std::string field = "model.merges[" + std::to_string(i) + "]";
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        throw Error(path_, field, json(s).dump() + " is not \"a b\"");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      throw Error(path_, field, e.dump().substr(0, 80) + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    auto id_of = [&](const std::string& tok, std::string* r) {
      auto it = byte_level_to_raw(tok, r) ? raw_to_id_.find(*r) : raw_to_id_.end();
      if (it == raw_to_id_.end())
        throw Error(path_, field, "token " + json(tok).dump() + " is not in model.vocab");
      return it->second;
    };
    const int ia = id_of(a, &ra), ib = id_of(b, &rb);
    auto it = raw_to_id_.find(ra + rb);
    if (it == raw_to_id_.end())
      throw Error(path_, field, "merged token " + json(a + b).dump() + " is not in model.vocab");
    merges_[pair_key(ia, ib)] = Merge{int(i), it->second};  // a repeated pair: the later rank, as HF
  }
}

void ByteLevelBpeTokenizer::parse_added_tokens(const json& j) {
  if (!j.contains("added_tokens") || j["added_tokens"].is_null()) return;
  if (!j["added_tokens"].is_array()) throw Error(path_, "added_tokens", "not an array");
  const json& arr = j["added_tokens"];
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& e = arr[i];
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    if (!e.is_object() || !e.contains("id") || !e["id"].is_number_integer() || !e.contains("content") ||
        !e["content"].is_string())
      throw Error(path_, field, "needs an integer id and a string content");
    AddedToken t;
    const int64_t id = e["id"].get<int64_t>();
    if (id < 0 || id > (1 << 24)) throw Error(path_, field + ".id", std::to_string(id) + " out of range");
    t.id = int(id);
    t.content = e["content"].get<std::string>();
    std::string check;
    if (sanitize_utf8(t.content, &check) != 0) throw Error(path_, field + ".content", "not valid UTF-8");
    auto flag = [&](const char* f, bool dflt) {
      if (!e.contains(f) || e[f].is_null()) return dflt;
      if (!e[f].is_boolean()) throw Error(path_, field + "." + f, e[f].dump() + " is not a boolean");
      return e[f].get<bool>();
    };
    t.special = flag("special", false);
    t.normalized = flag("normalized", !t.special);
    t.lstrip = flag("lstrip", false);
    t.rstrip = flag("rstrip", false);
    t.single_word = flag("single_word", false);
    if (size_t(t.id) >= decode_bytes_.size()) {
      decode_bytes_.resize(size_t(t.id) + 1);
      has_id_.resize(size_t(t.id) + 1, 0);
    }
    decode_bytes_[size_t(t.id)] = t.content;
    has_id_[size_t(t.id)] = 1;
    const int index = int(added_.size());
    added_.push_back(t);
    (t.normalized ? matcher_normalized_ : matcher_raw_).add(t.content, index);
    by_content_[t.content] = t.id;
  }
}

void ByteLevelBpeTokenizer::parse_normalizer(const json& j) {
  if (!j.contains("normalizer") || j["normalizer"].is_null()) return;
  std::function<void(const json&, const std::string&)> one = [&](const json& n, const std::string& field) {
    const std::string type = type_of(n);
    if (type == "NFC") {
      nfc_ = true;
    } else if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
      for (size_t i = 0; i < n["normalizers"].size(); ++i)
        one(n["normalizers"][i], field + ".normalizers[" + std::to_string(i) + "]");
    } else {
      throw Error(path_, field + ".type", "'" + type + "' is not supported (NFC or none)");
    }
  };
  one(j["normalizer"], "normalizer");
}

void ByteLevelBpeTokenizer::parse_pre_tokenizer(const json& j) {
  if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null())
    throw Error(path_, "pre_tokenizer", "missing (a byte-level BPE needs ByteLevel)");
  std::function<void(const json&, const std::string&)> one = [&](const json& p, const std::string& field) {
    const std::string type = type_of(p);
    if (type == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array()) {
      for (size_t i = 0; i < p["pretokenizers"].size(); ++i)
        one(p["pretokenizers"][i], field + ".pretokenizers[" + std::to_string(i) + "]");
    } else if (type == "Split") {
      if (p.contains("invert") && p["invert"].is_boolean() && p["invert"].get<bool>())
        throw Error(path_, field + ".invert", "true is not supported");
      const std::string behavior = p.contains("behavior") && p["behavior"].is_string() ? p["behavior"].get<std::string>() : "";
      if (behavior != "Isolated")
        throw Error(path_, field + ".behavior", "'" + behavior + "' is not supported (Isolated only)");
      if (!p.contains("pattern") || !p["pattern"].is_object())
        throw Error(path_, field + ".pattern", "missing");
      const json& pat = p["pattern"];
      Step s;
      if (pat.contains("Regex") && pat["Regex"].is_string()) {
        s.regex = compile_regex(pat["Regex"].get<std::string>(), false, path_, field + ".pattern.Regex");
      } else if (pat.contains("String") && pat["String"].is_string()) {
        s.regex = compile_regex(pat["String"].get<std::string>(), true, path_, field + ".pattern.String");
      } else {
        throw Error(path_, field + ".pattern", "neither Regex nor String");
      }
      steps_.push_back(std::move(s));
    } else if (type == "ByteLevel") {
      Step s;
      s.byte_level = true;
      s.add_prefix_space = p.contains("add_prefix_space") && p["add_prefix_space"].is_boolean() &&
                           p["add_prefix_space"].get<bool>();
      const bool use_regex = !p.contains("use_regex") || !p["use_regex"].is_boolean() || p["use_regex"].get<bool>();
      if (use_regex) s.regex = compile_regex(kGpt2Pattern, false, path_, field);
      steps_.push_back(std::move(s));
      saw_byte_level_ = true;
    } else {
      throw Error(path_, field + ".type", "'" + type + "' is not supported (Split, ByteLevel, Sequence)");
    }
  };
  one(j["pre_tokenizer"], "pre_tokenizer");
  if (!saw_byte_level_) throw Error(path_, "pre_tokenizer", "has no ByteLevel step (not a byte-level BPE)");
}

void ByteLevelBpeTokenizer::parse_decoder(const json& j) {
  if (!j.contains("decoder") || j["decoder"].is_null()) return;
  const std::string type = type_of(j["decoder"]);
  if (type != "ByteLevel") throw Error(path_, "decoder.type", "'" + type + "' is not supported (ByteLevel)");
}

// TemplateProcessing whose single template starts with a special token: that token is the BOS.
void ByteLevelBpeTokenizer::parse_post_processor(const json& j) {
  if (!j.contains("post_processor") || j["post_processor"].is_null()) return;
  std::function<void(const json&, const std::string&)> one = [&](const json& p, const std::string& field) {
    const std::string type = type_of(p);
    if (type == "Sequence" && p.contains("processors") && p["processors"].is_array()) {
      for (size_t i = 0; i < p["processors"].size(); ++i)
        one(p["processors"][i], field + ".processors[" + std::to_string(i) + "]");
    } else if (type == "TemplateProcessing") {
      if (!p.contains("single") || !p["single"].is_array() || p["single"].empty()) return;
      const json& first = p["single"][0];
      if (!first.is_object() || !first.contains("SpecialToken")) return;
      const json& st = first["SpecialToken"];
      if (!st.contains("id") || !st["id"].is_string()) throw Error(path_, field + ".single[0]", "SpecialToken without id");
      const std::string name = st["id"].get<std::string>();
      int id = -1;
      // The id is taken as written (HF's TemplateProcessing does not look it up), so it must be
      // one the vocabulary has: the BOS goes straight into the embedding lookup. (const json's
      // operator[] on a missing key is undefined: every level is checked first.)
      const json* sts = p.contains("special_tokens") ? &p["special_tokens"] : nullptr;
      if (sts && sts->is_object() && sts->contains(name) && (*sts)[name].is_object() && (*sts)[name].contains("ids")) {
        const json& ids = (*sts)[name]["ids"];
        if (ids.is_array() && ids.size() == 1 && ids[0].is_number_integer()) {
          const int64_t v = ids[0].get<int64_t>();
          if (v < 0 || v >= int64_t(decode_bytes_.size()) || !has_id_[size_t(v)])
            throw Error(path_, field + ".special_tokens[" + json(name).dump() + "].ids",
                        std::to_string(v) + " is not a token id of the vocabulary");
          id = int(v);
        }
      }
      if (id < 0) id = resolve(name);
      if (id < 0) throw Error(path_, field + ".single[0]", "special token " + json(name).dump() + " has no id");
      bos_ = id;
      adds_bos_ = true;
    } else if (type != "ByteLevel") {
      throw Error(path_, field + ".type", "'" + type + "' is not supported (ByteLevel, TemplateProcessing, Sequence)");
    }
  };
  one(j["post_processor"], "post_processor");
}

// tokenizer_config.json beside tokenizer.json (transformers' view): add_bos_token and the
// bos/eos strings; where it says add_bos_token, it decides.
void ByteLevelBpeTokenizer::parse_config() {
  const fs::path cfg_path = fs::path(path_).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (!fs::exists(cfg_path, ec)) return;
  const std::string cp = cfg_path.string();
  json c;
  try {
    c = json::parse(read_file(cp));
  } catch (const json::exception& e) {
    throw Error(cp, "", std::string("not valid JSON: ") + e.what());
  }
  if (!c.is_object()) throw Error(cp, "", "not a JSON object");
  auto token_of = [&](const char* f) -> int {
    if (!c.contains(f) || c[f].is_null()) return -1;
    std::string s;
    if (c[f].is_string()) s = c[f].get<std::string>();
    else if (c[f].is_object() && c[f].contains("content") && c[f]["content"].is_string()) s = c[f]["content"].get<std::string>();
    else throw Error(cp, f, c[f].dump().substr(0, 80) + " is neither a string nor {content}");
    const int id = resolve(s);
    if (id < 0) throw Error(cp, f, json(s).dump() + " is not a token of " + path_);
    return id;
  };
  const int bos = token_of("bos_token");
  const int eos = token_of("eos_token");
  if (eos >= 0) eos_ = eos;
  if (c.contains("add_bos_token") && c["add_bos_token"].is_boolean()) {
    adds_bos_ = c["add_bos_token"].get<bool>();
    if (adds_bos_) {
      if (bos >= 0) bos_ = bos;
      if (bos_ < 0) throw Error(cp, "add_bos_token", "true but bos_token is not set");
    }
  } else if (bos_ < 0 && bos >= 0) {
    bos_ = bos;  // known, though not prepended
  }
}

int ByteLevelBpeTokenizer::resolve(const std::string& content) const {
  if (auto it = by_content_.find(content); it != by_content_.end()) return it->second;
  std::string raw;
  if (byte_level_to_raw(content, &raw))
    if (auto it = raw_to_id_.find(raw); it != raw_to_id_.end()) return it->second;
  return -1;
}

}  // namespace tokjson

std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& path, const std::string& bytes) {
  return std::make_unique<tokjson::ByteLevelBpeTokenizer>(path, bytes);
}

}  // namespace kvq
