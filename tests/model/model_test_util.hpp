#pragma once
// Test-side helpers for the model tests: an independent safetensors writer/reader (so the library
// reader is checked against code that does not share its parsing), tiny synthetic checkpoints, and
// an error-message matcher.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "kvq/util/error.hpp"

namespace kvq::test {

namespace fs = std::filesystem;

struct StEntry {
  std::string dtype = "F32";
  std::vector<int64_t> shape;
  std::string bytes;  // raw little-endian payload
};
using StMap = std::map<std::string, StEntry>;  // sorted by name, like the reference writer

inline std::string st_pack(const nlohmann::json& header, const std::string& data) {
  const std::string h = header.dump();
  std::string out(8, '\0');
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = char((n >> (8 * i)) & 0xff);
  return out + h + data;
}

inline std::string st_serialize(const StMap& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  return st_pack(header, data);
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

inline StMap st_read(const std::string& path) {
  const std::string b = read_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(b[i]);
  const auto header = nlohmann::json::parse(b.substr(8, n));
  StMap out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    StEntry e;
    e.dtype = it.value()["dtype"].get<std::string>();
    e.shape = it.value()["shape"].get<std::vector<int64_t>>();
    const uint64_t lo = it.value()["data_offsets"][0], hi = it.value()["data_offsets"][1];
    e.bytes = b.substr(8 + n + lo, hi - lo);
    out[it.key()] = e;
  }
  return out;
}

inline std::vector<float> as_floats(const StEntry& e) {
  std::vector<float> v(e.bytes.size() / 4);
  std::memcpy(v.data(), e.bytes.data(), v.size() * 4);
  return v;
}

inline StEntry f32_entry(std::vector<int64_t> shape, const std::vector<float>& v) {
  StEntry e;
  e.shape = std::move(shape);
  e.bytes.assign(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  return e;
}

// A fresh directory under the system temp dir, removed at scope exit.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string("kvq_model_") + (info ? info->name() : "x") + "_" +
                       std::to_string(std::random_device{}());
    path_ = fs::temp_directory_path() / name;
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { std::error_code ec; fs::remove_all(path_, ec); }
  std::string operator/(const std::string& rel) const { return (path_ / rel).string(); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

// Runs fn, expects a kvq::Error whose message contains every one of `parts`.
inline void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no kvq::Error thrown; expected one mentioning " << ::testing::PrintToString(parts);
  } catch (const kvq::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected kvq::Error, got another exception: " << e.what();
  }
}

// A tiny Llama-family checkpoint with seeded random weights, written as an HF directory.
struct TinySpec {
  std::string model_type = "llama";
  int hidden = 16, layers = 2, heads = 4, kv_heads = 2, head_dim = 8, inter = 24, vocab = 40;
  double theta = 10000.0, eps = 1e-5, partial_rotary = 1.0;
  bool tied = false, qkv_bias = false;
  uint32_t seed = 7;
};

inline nlohmann::json tiny_config(const TinySpec& s) {
  nlohmann::json c = {{"model_type", s.model_type},        {"hidden_size", s.hidden},
                      {"num_hidden_layers", s.layers},     {"num_attention_heads", s.heads},
                      {"num_key_value_heads", s.kv_heads}, {"head_dim", s.head_dim},
                      {"intermediate_size", s.inter},      {"vocab_size", s.vocab},
                      {"rope_theta", s.theta},             {"rms_norm_eps", s.eps},
                      {"max_position_embeddings", 128},    {"tie_word_embeddings", s.tied},
                      {"hidden_act", "silu"},              {"bos_token_id", 1},
                      {"eos_token_id", 2}};
  if (s.partial_rotary != 1.0) c["partial_rotary_factor"] = s.partial_rotary;
  return c;
}

inline StMap tiny_weights(const TinySpec& s) {
  std::mt19937 rng(s.seed);
  std::normal_distribution<float> g(0.f, 1.f);
  auto rnd = [&](std::vector<int64_t> shape, float scale, float offset = 0.f) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = offset + scale * g(rng);
    return f32_entry(shape, v);
  };
  const int64_t D = s.hidden, qd = int64_t(s.heads) * s.head_dim, kvd = int64_t(s.kv_heads) * s.head_dim;
  StMap m;
  m["model.embed_tokens.weight"] = rnd({s.vocab, D}, 1.0f);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    m[p + "input_layernorm.weight"] = rnd({D}, 0.1f, 1.0f);
    m[p + "post_attention_layernorm.weight"] = rnd({D}, 0.1f, 1.0f);
    m[p + "self_attn.q_proj.weight"] = rnd({qd, D}, 0.4f);
    m[p + "self_attn.k_proj.weight"] = rnd({kvd, D}, 0.4f);
    m[p + "self_attn.v_proj.weight"] = rnd({kvd, D}, 0.4f);
    m[p + "self_attn.o_proj.weight"] = rnd({D, qd}, 0.2f);
    if (s.qkv_bias) {
      m[p + "self_attn.q_proj.bias"] = rnd({qd}, 0.5f);
      m[p + "self_attn.k_proj.bias"] = rnd({kvd}, 0.5f);
      m[p + "self_attn.v_proj.bias"] = rnd({kvd}, 0.5f);
    }
    m[p + "mlp.gate_proj.weight"] = rnd({s.inter, D}, 0.3f);
    m[p + "mlp.up_proj.weight"] = rnd({s.inter, D}, 0.3f);
    m[p + "mlp.down_proj.weight"] = rnd({D, s.inter}, 0.2f);
  }
  m["model.norm.weight"] = rnd({D}, 0.1f, 1.0f);
  if (!s.tied) m["lm_head.weight"] = rnd({s.vocab, D}, 0.3f);
  return m;
}

inline void write_hf_dir(const std::string& dir, const nlohmann::json& config, const StMap& tensors) {
  fs::create_directories(dir);
  write_bytes(dir + "/config.json", config.dump(2));
  write_bytes(dir + "/model.safetensors", st_serialize(tensors));
}

}  // namespace kvq::test
