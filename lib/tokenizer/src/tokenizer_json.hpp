#pragma once
// Hugging Face tokenizer.json (byte-level BPE), internal to lib/model: Tokenizer::load picks it by
// content. Defined in tokenizer_json_{text,load,encode}.cpp (internals: tokenizer_json_internal.hpp).
#include <memory>
#include <string>

namespace kvq {

class Tokenizer;  // kvq/tokenizer/tokenizer.hpp; declared only, so this header sits below tokenizer.cpp

// True when `bytes` look like a JSON object (first non-blank byte '{').
bool looks_like_tokenizer_json(const std::string& bytes);
// True when the first line reads "<base64> <word>" (base64 characters, a multiple of 4), as
// tiktoken ranks files ("base64 rank" lines: GLM-4's tokenizer.model, Meta's original/) do.
bool looks_like_tiktoken(const std::string& bytes);

// Parses tokenizer.json (and tokenizer_config.json beside it, when present, for the BOS rule).
// Throws kvq::Error naming the file, the field and the value for anything unsupported or broken.
std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& path, const std::string& bytes);

// Replaces each maximal invalid UTF-8 subpart with U+FFFD (as Rust's from_utf8_lossy and
// WHATWG decoders do). Returns the number of replacements.
size_t sanitize_utf8(const std::string& in, std::string* out);

}  // namespace kvq
