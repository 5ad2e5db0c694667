#pragma once
#include <memory>
#include <string>
#include <vector>

namespace kvq {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int> encode(const std::string& text) const = 0;  // no BOS
  virtual std::string decode(const std::vector<int>& ids) const = 0;
  virtual int vocab_size() const = 0;
  virtual int bos_id() const = 0;
  virtual int eos_id() const = 0;
  const std::string& path() const { return path_; }
  const std::string& sha256() const { return sha256_; }

  // SentencePiece `tokenizer.model` or llama2.c `tokenizer.bin`, chosen by content.
  static std::unique_ptr<Tokenizer> load(const std::string& path);
  // The tokenizer that belongs to a model path: <dir>/tokenizer.model for HF directories;
  // for a llama2.c .bin, tokenizer.bin or tok<vocab>.bin beside it.
  static std::string default_path_for_model(const std::string& model_path, int vocab_size);

 protected:
  std::string path_, sha256_;
};

}  // namespace kvq
