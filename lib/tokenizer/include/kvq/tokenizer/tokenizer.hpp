#pragma once
#include <memory>
#include <string>
#include <vector>

namespace kvq {

// How special-token strings (e.g. "<|begin_of_text|>") that occur in the text are encoded.
// kSpecial: as Hugging Face does, each becomes its one id. kText: encoded as ordinary text.
enum class SpecialTokens { kSpecial, kText };

// "special" / "text"; parse_special_tokens throws kvq::Error naming `field` for anything else.
const char* to_string(SpecialTokens mode);
SpecialTokens parse_special_tokens(const std::string& value, const std::string& field = "--special-tokens");

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int> encode(const std::string& text) const = 0;  // no BOS
  // encode() with the special-token mode; *special_matched (when non-null) receives how many
  // special-token strings of the text became special ids (0 with kText or without specials).
  virtual std::vector<int> encode(const std::string& text, SpecialTokens mode, int* special_matched) const;
  // The model's rule applied: prefix_ids() first, then encode(text, mode, ...).
  std::vector<int> encode_with_bos(const std::string& text, SpecialTokens mode = SpecialTokens::kSpecial,
                                   int* special_matched = nullptr) const;
  virtual std::string decode(const std::vector<int>& ids) const = 0;
  virtual int vocab_size() const = 0;
  virtual int bos_id() const = 0;  // -1 when the tokenizer has none
  virtual int eos_id() const = 0;  // -1 when the tokenizer has none
  // Whether the model's sequences start with bos_id(). SentencePiece and llama2.c: always;
  // tokenizer.json: its post-processor template or tokenizer_config.json's add_bos_token (Qwen: no).
  virtual bool adds_bos() const { return true; }
  // The ids every sequence starts with: {bos_id()} when adds_bos(), else none; GLM-4's tiktoken
  // tokenizer: [gMASK] <sop> (and adds_bos() false).
  virtual std::vector<int> prefix_ids() const;
  const std::string& path() const { return path_; }
  const std::string& sha256() const { return sha256_; }

  // Chosen by content: Hugging Face tokenizer.json (byte-level BPE), a tiktoken ranks file
  // (GLM-4's tokenizer.model, Meta's Llama-3 original/tokenizer.model; see tokenizer_tiktoken.hpp),
  // SentencePiece tokenizer.model or llama2.c tokenizer.bin. Anything else: one line naming the
  // formats tried.
  static std::unique_ptr<Tokenizer> load(const std::string& path);
  // The tokenizer that belongs to a model path: for HF directories <dir>/tokenizer.json when it
  // exists, else <dir>/tokenizer.model; for a llama2.c .bin, tokenizer.bin or tok<vocab>.bin beside it.
  static std::string default_path_for_model(const std::string& model_path, int vocab_size);

 protected:
  std::string path_, sha256_;
};

}  // namespace kvq
