// Hugging Face tokenizer.json, byte-level BPE (Llama-3, Qwen2.5/3, R1-Distill, Mistral-Nemo).
// The pipeline is HF's: added tokens split out of the raw text, normalizer (NFC or none),
// pre-tokenizer (Split with the file's regex, ByteLevel), BPE by merge rank, post-processor for
// the BOS. The rules are written down in ../shared/MODEL-FAMILIES.md ("tokenizer.json").
#include "tokenizer_json.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <string_view>
#include <unordered_map>

#include "kvq/util/atomic_file.hpp"
#include "kvq/util/error.hpp"
#include "kvq/util/sha256.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace kvq {

size_t sanitize_utf8(const std::string& in, std::string* out) {
  out->clear();
  out->reserve(in.size());
  const auto* s = reinterpret_cast<const unsigned char*>(in.data());
  const size_t n = in.size();
  size_t replaced = 0, i = 0;
  while (i < n) {
    const unsigned char b = s[i];
    if (b < 0x80) {
      // ASCII runs are the common case: copy them in one go.
      size_t j = i + 1;
      while (j < n && s[j] < 0x80) ++j;
      out->append(in, i, j - i);
      i = j;
      continue;
    }
    int need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
    if (b >= 0xC2 && b <= 0xDF) {
      need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      need = 2;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;  // no surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      need = 3;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    }
    size_t j = i + 1;
    int got = 0;
    while (got < need && j < n) {
      const unsigned char c = s[j];
      const bool ok = got == 0 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
      if (!ok) break;
      ++j;
      ++got;
    }
    if (need > 0 && got == need) {
      out->append(in, i, j - i);
    } else {
      out->append("\xEF\xBF\xBD");  // one U+FFFD per maximal invalid subpart
      ++replaced;
    }
    i = j;
  }
  return replaced;
}

bool looks_like_tokenizer_json(const std::string& bytes) {
  for (char c : bytes) {
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') continue;
    return c == '{';
  }
  return false;
}

bool looks_like_tiktoken(const std::string& bytes) {
  const size_t eol = bytes.find('\n');
  const std::string line = bytes.substr(0, eol == std::string::npos ? std::min<size_t>(bytes.size(), 512) : eol);
  const size_t sp = line.find(' ');
  if (sp == std::string::npos || sp == 0 || sp + 1 >= line.size()) return false;
  for (size_t i = 0; i < sp; ++i) {
    const char c = line[i];
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '+' && c != '/' && c != '=') return false;
  }
  for (size_t i = sp + 1; i < line.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(line[i])) && !(line[i] == '\r' && i + 1 == line.size())) return false;
  return true;
}

namespace {

// ---- UTF-8 and Unicode helpers (input is valid UTF-8 by the time they run) ----

int32_t decode_at(std::string_view s, size_t i, size_t* len) {
  utf8proc_int32_t cp = 0;
  const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                  utf8proc_ssize_t(s.size() - i), &cp);
  *len = n > 0 ? size_t(n) : 1;
  return n > 0 ? cp : 0xFFFD;
}

// The code point ending at byte `end` (exclusive).
int32_t decode_before(std::string_view s, size_t end, size_t* len) {
  size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80 && end - b < 4) --b;
  size_t l;
  const int32_t cp = decode_at(s, b, &l);
  *len = end - b;
  return cp;
}

// Unicode White_Space (Rust's char::is_whitespace, which HF uses for lstrip/rstrip).
bool is_white_space(int32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_word_char(int32_t c) {
  if (c == '_') return true;
  switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}


// GPT-2's byte <-> unicode table: printable Latin-1 bytes map to themselves, the other 68 bytes,
// ascending, to U+0100 + n.
struct ByteLevelTable {
  std::array<int32_t, 256> byte_to_cp{};
  std::unordered_map<int32_t, unsigned char> cp_to_byte;
  ByteLevelTable() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      byte_to_cp[size_t(b)] = keep ? b : 0x100 + n++;
      cp_to_byte[byte_to_cp[size_t(b)]] = static_cast<unsigned char>(b);
    }
  }
};
const ByteLevelTable& byte_level() {
  static const ByteLevelTable t;
  return t;
}

// A byte-level token string back to its raw bytes; false when a character is outside the alphabet.
bool byte_level_to_raw(const std::string& tok, std::string* raw) {
  const auto& t = byte_level();
  raw->clear();
  for (size_t i = 0; i < tok.size();) {
    size_t len;
    const int32_t cp = decode_at(tok, i, &len);
    auto it = t.cp_to_byte.find(cp);
    if (it == t.cp_to_byte.end()) return false;
    raw->push_back(char(it->second));
    i += len;
  }
  return true;
}

// ---- PCRE2 ----

struct Regex {
  pcre2_code* code = nullptr;
  bool jit = false;
  Regex() = default;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() { if (code) pcre2_code_free(code); }
};

// Per-thread match state: a JIT stack large enough for long whitespace runs under `\s+(?!\S)`.
struct MatchScratch {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mc = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchScratch() {
    md = pcre2_match_data_create(4, nullptr);
    mc = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (mc && stack) pcre2_jit_stack_assign(mc, nullptr, stack);
  }
  ~MatchScratch() {
    if (stack) pcre2_jit_stack_free(stack);
    if (mc) pcre2_match_context_free(mc);
    if (md) pcre2_match_data_free(md);
  }
};
MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

std::unique_ptr<Regex> compile_regex(const std::string& pattern, bool literal, const std::string& file,
                                     const std::string& field) {
  int err = 0;
  PCRE2_SIZE off = 0;
  auto r = std::make_unique<Regex>();
  const uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
  r->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts, &err, &off, nullptr);
  if (!r->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw Error(file, field, "invalid regex at offset " + std::to_string(off) + ": " +
                                 reinterpret_cast<const char*>(msg) + " (pattern " + json(pattern).dump() + ")");
  }
  r->jit = pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE) == 0;
  return r;
}

// Calls piece(begin, end) for every match and every gap between matches (HF's Isolated split).
template <class F>
void split_isolated(const Regex& re, std::string_view s, F&& piece) {
  MatchScratch& sc = scratch();
  size_t prev = 0, at = 0;
  while (at <= s.size()) {
    int rc = re.jit ? pcre2_jit_match(re.code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at,
                                      PCRE2_NO_UTF_CHECK, sc.md, sc.mc)
                    : PCRE2_ERROR_JIT_BADOPTION;
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_JIT_BADOPTION)
      rc = pcre2_match(re.code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at, PCRE2_NO_UTF_CHECK, sc.md,
                       nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw Error("", "pre_tokenizer", std::string("regex match failed: ") + reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(sc.md);
    const size_t b = ov[0], e = ov[1];
    if (e == b) {  // an empty match is no piece; step one character past it
      if (b >= s.size()) break;
      size_t len;
      decode_at(s, b, &len);
      at = b + len;
      continue;
    }
    if (b > prev) piece(prev, b);
    piece(b, e);
    prev = at = e;
  }
  if (prev < s.size()) piece(prev, s.size());
}

// GPT-2's pre-tokenizer regex (ByteLevel with use_regex true).
const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct AddedToken {
  int id = -1;
  std::string content;
  bool special = false, normalized = false, lstrip = false, rstrip = false, single_word = false;
};

// Leftmost-longest matcher over the added-token strings (HF builds an Aho-Corasick automaton with
// MatchKind::LeftmostLongest; a trie walked from each candidate start gives the same matches).
class AddedMatcher {
 public:
  void add(const std::string& s, int token) {
    if (s.empty()) return;
    int node = 0;
    for (unsigned char c : s) {
      int next = child(node, c);
      if (next < 0) {
        next = int(nodes_.size());
        nodes_.push_back({});
        nodes_[size_t(node)].kids.push_back({c, next});
      }
      node = next;
    }
    nodes_[size_t(node)].token = token;
    first_[s[0] & 0xFF] = true;
  }
  bool empty() const { return nodes_.size() == 1; }
  // Next match at or after `from`: (begin, end, token), or begin == npos.
  std::array<size_t, 3> find(std::string_view s, size_t from) const {
    for (size_t p = from; p < s.size(); ++p) {
      if (!first_[static_cast<unsigned char>(s[p])]) continue;
      int node = 0, best_tok = -1;
      size_t best_end = 0;
      for (size_t q = p; q < s.size(); ++q) {
        node = child(node, static_cast<unsigned char>(s[q]));
        if (node < 0) break;
        if (nodes_[size_t(node)].token >= 0) {
          best_tok = nodes_[size_t(node)].token;
          best_end = q + 1;
        }
      }
      if (best_tok >= 0) return {p, best_end, size_t(best_tok)};
    }
    return {std::string_view::npos, 0, 0};
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> kids;
    int token = -1;
  };
  int child(int node, unsigned char c) const {
    for (const auto& [k, n] : nodes_[size_t(node)].kids)
      if (k == c) return n;
    return -1;
  }
  std::vector<Node> nodes_{Node{}};
  std::array<bool, 256> first_{};
};

std::string type_of(const json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return "";
  return j["type"].get<std::string>();
}

class ByteLevelBpeTokenizer : public Tokenizer {
 public:
  ByteLevelBpeTokenizer(const std::string& path, const std::string& bytes) {
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

  using Tokenizer::encode;
  std::vector<int> encode(const std::string& text) const override {
    return encode(text, SpecialTokens::kSpecial, nullptr);
  }

  std::vector<int> encode(const std::string& raw_text, SpecialTokens mode, int* special_matched) const override {
    std::string text;
    sanitize_utf8(raw_text, &text);  // HF takes a Rust str: invalid bytes become U+FFFD first
    std::vector<int> ids;
    ids.reserve(text.size() / 3 + 8);
    int matched = 0;
    split_added(text, /*normalized_stage=*/false, mode, &ids, &matched, [&](std::string_view seg) {
      if (!nfc_) return encode_normalized(seg, mode, &ids, &matched);
      std::string norm;
      normalize(seg, &norm);
      encode_normalized(norm, mode, &ids, &matched);
    });
    if (special_matched) *special_matched = matched;
    return ids;
  }

  std::string decode(const std::vector<int>& ids) const override {
    std::string out;
    for (int id : ids) {
      if (id < 0 || id >= int(decode_bytes_.size()) || !has_id_[size_t(id)])
        throw Error(path_, "decode", "token id " + std::to_string(id) + " is not in the vocabulary");
      out += decode_bytes_[size_t(id)];
    }
    std::string clean;
    sanitize_utf8(out, &clean);  // HF's ByteLevel decoder ends in from_utf8_lossy
    return clean;
  }
  int vocab_size() const override { return int(decode_bytes_.size()); }
  int bos_id() const override { return bos_; }
  int eos_id() const override { return eos_; }
  bool adds_bos() const override { return adds_bos_ && bos_ >= 0; }

 private:
  // ---- loading ----
  void parse_model(const json& j) {
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
    const auto& t = byte_level();
    for (int b = 0; b < 256; ++b) {
      auto it = raw_to_id_.find(std::string(1, char(b)));
      byte_id_[size_t(b)] = it == raw_to_id_.end() ? -1 : it->second;
      (void)t;
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

  void parse_added_tokens(const json& j) {
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

  void parse_normalizer(const json& j) {
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

  void parse_pre_tokenizer(const json& j) {
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

  void parse_decoder(const json& j) {
    if (!j.contains("decoder") || j["decoder"].is_null()) return;
    const std::string type = type_of(j["decoder"]);
    if (type != "ByteLevel") throw Error(path_, "decoder.type", "'" + type + "' is not supported (ByteLevel)");
  }

  int resolve(const std::string& content) const {
    if (auto it = by_content_.find(content); it != by_content_.end()) return it->second;
    std::string raw;
    if (byte_level_to_raw(content, &raw))
      if (auto it = raw_to_id_.find(raw); it != raw_to_id_.end()) return it->second;
    return -1;
  }

  // TemplateProcessing whose single template starts with a special token: that token is the BOS.
  void parse_post_processor(const json& j) {
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
        if (p.contains("special_tokens") && p["special_tokens"].contains(name)) {
          const json& ids = p["special_tokens"][name]["ids"];
          if (ids.is_array() && ids.size() == 1 && ids[0].is_number_integer()) id = ids[0].get<int>();
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
  void parse_config() {
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

  // ---- encoding ----
  static uint64_t pair_key(int a, int b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  void normalize(std::string_view s, std::string* out) const {
    bool ascii = true;
    for (char c : s)
      if (static_cast<unsigned char>(c) >= 0x80) { ascii = false; break; }
    if (ascii) {  // NFC leaves ASCII alone
      out->assign(s);
      return;
    }
    utf8proc_uint8_t* res = nullptr;
    const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()), &res,
                                utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    if (n < 0) {
      out->assign(s);
    } else {
      out->assign(reinterpret_cast<const char*>(res), size_t(n));
    }
    std::free(res);
  }

  // Splits `text` on the added tokens of one stage (raw text, or normalized text); the added
  // tokens' ids go to *ids, every other segment to `rest`, in order.
  template <class F>
  void split_added(std::string_view text, bool normalized_stage, SpecialTokens mode, std::vector<int>* ids,
                   int* matched, F&& rest) const {
    const AddedMatcher& m = normalized_stage ? matcher_normalized_ : matcher_raw_;
    if (m.empty()) {
      if (!text.empty()) rest(text);
      return;
    }
    size_t from = 0, emitted = 0;  // emitted: text before this offset is handed out
    while (from < text.size()) {
      auto [b, e, idx] = m.find(text, from);
      if (b == std::string_view::npos) break;
      const AddedToken& t = added_[idx];
      from = e;
      // With kText, special tokens are found and dropped (HF's encode_special_tokens): the text
      // they cover stays plain text.
      if (t.special && mode == SpecialTokens::kText) continue;
      if (t.single_word) {
        size_t l;
        if ((b > 0 && is_word_char(decode_before(text, b, &l))) || (e < text.size() && is_word_char(decode_at(text, e, &l))))
          continue;
      }
      if (t.lstrip) {
        size_t l;
        while (b > emitted && is_white_space(decode_before(text, b, &l))) b -= l;
      }
      if (t.rstrip) {
        size_t l;
        while (e < text.size() && is_white_space(decode_at(text, e, &l))) e += l;
        from = e;
      }
      if (b > emitted) rest(text.substr(emitted, b - emitted));
      ids->push_back(t.id);
      if (t.special) ++*matched;
      emitted = e;
    }
    if (emitted < text.size()) rest(text.substr(emitted));
  }

  void encode_normalized(std::string_view seg, SpecialTokens mode, std::vector<int>* ids, int* matched) const {
    split_added(seg, true, mode, ids, matched, [&](std::string_view s) { pre_tokenize(0, s, ids); });
  }

  void pre_tokenize(size_t step, std::string_view s, std::vector<int>* ids) const {
    if (s.empty()) return;
    if (step == steps_.size()) return bpe(s, ids);
    const Step& st = steps_[step];
    if (st.byte_level && st.add_prefix_space && s[0] != ' ') {
      const std::string spaced = " " + std::string(s);
      return pre_tokenize_step(step, spaced, ids);
    }
    pre_tokenize_step(step, s, ids);
  }
  void pre_tokenize_step(size_t step, std::string_view s, std::vector<int>* ids) const {
    const Step& st = steps_[step];
    if (!st.regex) return pre_tokenize(step + 1, s, ids);
    split_isolated(*st.regex, s, [&](size_t b, size_t e) { pre_tokenize(step + 1, s.substr(b, e - b), ids); });
  }

  // One pre-token (raw bytes) to ids: the cache, else ignore_merges' whole-word lookup, else merges.
  void bpe(std::string_view piece, std::vector<int>* ids) const {
    if (piece.size() == 1) {
      if (const int id = byte_id_[static_cast<unsigned char>(piece[0])]; id >= 0) ids->push_back(id);
      return;
    }
    const std::string key(piece);
    {
      std::lock_guard<std::mutex> lock(cache_mu_);
      if (auto it = cache_.find(key); it != cache_.end()) {
        ids->insert(ids->end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int> out;
    if (auto it = ignore_merges_ ? raw_to_id_.find(key) : raw_to_id_.end(); it != raw_to_id_.end()) {
      out.push_back(it->second);
    } else {
      merge(piece, &out);
    }
    ids->insert(ids->end(), out.begin(), out.end());
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() < kCacheEntries) cache_.emplace(key, std::move(out));
  }

  // Repeatedly merges the adjacent pair of lowest rank (leftmost on ties), as HF's BPE does with
  // its priority queue; a heap over a linked list of symbols keeps it O(n log n).
  void merge(std::string_view piece, std::vector<int>* out) const {
    const int n = int(piece.size());
    const size_t un = size_t(n);
    std::vector<int> tok(un), next(un), prev(un);
    int m = 0;
    for (int i = 0; i < n; ++i) {
      const int id = byte_id_[static_cast<unsigned char>(piece[size_t(i)])];
      if (id < 0) continue;  // a byte outside the vocabulary and no unk_token: dropped, as HF does
      tok[size_t(m++)] = id;
    }
    if (m == 0) return;
    for (int i = 0; i < m; ++i) { next[size_t(i)] = i + 1; prev[size_t(i)] = i - 1; }
    struct Cand { int rank, left, right, left_tok, right_tok, merged; };
    auto worse = [](const Cand& a, const Cand& b) { return a.rank != b.rank ? a.rank > b.rank : a.left > b.left; };
    std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
    auto consider = [&](int l, int r) {
      if (l < 0 || r >= m) return;
      auto it = merges_.find(pair_key(tok[size_t(l)], tok[size_t(r)]));
      if (it != merges_.end()) heap.push({it->second.rank, l, r, tok[size_t(l)], tok[size_t(r)], it->second.id});
    };
    for (int i = 0; i + 1 < m; ++i) consider(i, i + 1);
    std::vector<char> alive(size_t(m), 1);
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      if (!alive[size_t(c.left)] || !alive[size_t(c.right)] || next[size_t(c.left)] != c.right ||
          tok[size_t(c.left)] != c.left_tok || tok[size_t(c.right)] != c.right_tok)
        continue;  // stale: a neighbour merged since this pair was queued
      tok[size_t(c.left)] = c.merged;
      alive[size_t(c.right)] = 0;
      next[size_t(c.left)] = next[size_t(c.right)];
      if (next[size_t(c.right)] < m) prev[size_t(next[size_t(c.right)])] = c.left;
      consider(prev[size_t(c.left)], c.left);
      consider(c.left, next[size_t(c.left)]);
    }
    for (int i = 0; i < m; i = next[size_t(i)]) out->push_back(tok[size_t(i)]);
  }

  struct Step {
    std::unique_ptr<Regex> regex;  // null: no split at this step
    bool byte_level = false, add_prefix_space = false;
  };
  struct Merge { int rank, id; };
  static constexpr size_t kCacheEntries = size_t(1) << 20;

  std::vector<std::string> decode_bytes_;  // id -> raw bytes (added tokens: their content)
  std::vector<char> has_id_;
  std::unordered_map<std::string, int> raw_to_id_;
  std::array<int, 256> byte_id_{};
  std::unordered_map<uint64_t, Merge> merges_;
  bool ignore_merges_ = false;
  std::vector<AddedToken> added_;
  std::unordered_map<std::string, int> by_content_;
  AddedMatcher matcher_raw_, matcher_normalized_;
  bool nfc_ = false;
  std::vector<Step> steps_;
  bool saw_byte_level_ = false;
  int bos_ = -1, eos_ = -1;
  bool adds_bos_ = false;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int>> cache_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& path, const std::string& bytes) {
  return std::make_unique<ByteLevelBpeTokenizer>(path, bytes);
}

}  // namespace kvq
