#pragma once
// tiktoken ranks files (GLM-4's tokenizer.model, Meta's Llama-3 original/tokenizer.model, OpenAI's
// *.tiktoken), internal to lib/model: Tokenizer::load picks it by content. Defined in
// tokenizer_tiktoken.cpp.
//
// A ranks file holds one line per token, "base64(bytes) rank". Encoding: special-token strings are
// split out of the text first (leftmost-longest), the rest is cut into the pieces the split regex
// matches, and each piece is merged by rank: the adjacent pair whose concatenated bytes has the
// lowest rank merges first (leftmost on ties), until no pair is a token; a piece that is itself a
// token is emitted directly. The regex, the special tokens and the prefix come from what the
// file belongs to:
//   - tokenizer_config.json beside the file: its added_tokens_decoder are the specials,
//     bos_token / eos_token / add_bos_token the BOS rule; tokenizer_class ChatGLM4Tokenizer (or a
//     config.json beside with model_type chatglm) is GLM-4: [gMASK] <sop> start every sequence.
//   - no tokenizer_config.json and exactly 128000 ranks: Meta's Llama-3 (3.1 names), whose 256
//     specials follow the ranks (<|begin_of_text|> = 128000 is the BOS).
//   - no tokenizer_config.json and exactly 100256 ranks: OpenAI's cl100k_base (its own regex and
//     its five specials).
//   - otherwise: Llama-3's / GLM-4's regex (they are the same) and no specials.
#include <memory>
#include <string>
#include <vector>

namespace kvq {

class Tokenizer;  // kvq/tokenizer/tokenizer.hpp; declared only, so this header sits below tokenizer.cpp

// Parses a ranks file (and the tokenizer_config.json / config.json beside it, when present).
// Throws kvq::Error naming the file, the line or field and the value for anything broken: a line
// that is not base64, a rank that is not a number, a rank or token given twice, a byte with no rank.
std::unique_ptr<Tokenizer> load_tiktoken(const std::string& path, const std::string& bytes);

// The split regexes (public facts: tiktoken's cl100k_base, Meta's Llama-3 tokenizer.py, GLM-4's
// tokenization_chatglm.py).
extern const char* const kCl100kPattern;
extern const char* const kLlama3Pattern;

}  // namespace kvq
