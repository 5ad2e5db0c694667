// UTF-8 repair, file sniffing, the GPT-2 byte-level alphabet and PCRE2 compilation for the
// tokenizer.json reader (see tokenizer_json_internal.hpp).
#include <algorithm>
#include <cctype>

#include "tokenizer_json_internal.hpp"

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
  if (sp % 4 != 0) return false;
  // The rank is checked by the reader, so that "QUJD x" fails as a tiktoken file naming its line.
  for (size_t i = sp + 1; i < line.size(); ++i)
    if (std::isspace(static_cast<unsigned char>(line[i])) && !(line[i] == '\r' && i + 1 == line.size())) return false;
  return true;
}

namespace tokjson {
namespace {

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

}  // namespace

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

namespace {

// Unicode White_Space, as \s means in Rust's regex crates, Oniguruma and tiktoken. PCRE2's \s under
// UCP also takes U+180E (its fixed horizontal-space list predates Unicode 6.3), which split
// DeepSeek-V3's " \u180e" differently from Hugging Face.
constexpr const char* kWhiteSpace = "\\t\\n\\x{0b}\\f\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}";

// \s and \S spelled out as White_Space classes (inside a class: the bare list; \S inside a class,
// which cannot be spelled that way, is left to PCRE2).
std::string white_space_classes(const std::string& p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      ++i;
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (e == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else if (e == 'Q') {  // \Q...\E is literal: copy it through
        const size_t end = p.find("\\E", i + 1);
        const size_t stop = end == std::string::npos ? p.size() : end + 2;
        out.append(p, i - 1, stop - (i - 1));
        i = stop - 1;
      } else {
        out.push_back(c);
        out.push_back(e);
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
      if (i + 1 < p.size() && p[i + 1] == ']') out.push_back(p[++i]);  // a leading ']' is literal
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:] inside a class
      const size_t end = p.find(":]", i + 2);
      if (end != std::string::npos) {
        out.append(p, i, end + 2 - i);
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

}  // namespace

std::unique_ptr<Regex> compile_regex(const std::string& given, bool literal, const std::string& file,
                                     const std::string& field) {
  const std::string pattern = literal ? given : white_space_classes(given);
  int err = 0;
  PCRE2_SIZE off = 0;
  auto r = std::make_unique<Regex>();
  // PCRE2_LITERAL rejects PCRE2_UCP ("invalid option bits"); a literal has no classes for it to affect.
  const uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  r->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts, &err, &off, nullptr);
  if (!r->code) {
    if (pattern != given) {  // report the error and its offset in the pattern as the file wrote it
      pcre2_code* raw = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(given.data()), given.size(), opts, &err, &off, nullptr);
      if (raw) pcre2_code_free(raw);
    }
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw Error(file, field, "invalid regex at offset " + std::to_string(off) + ": " +
                                 reinterpret_cast<const char*>(msg) + " (pattern " + json(given).dump() + ")");
  }
  r->jit = pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE) == 0;
  return r;
}

const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string type_of(const json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return "";
  return j["type"].get<std::string>();
}

}  // namespace tokjson
}  // namespace kvq
