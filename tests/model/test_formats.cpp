// Checkpoint formats: sharded and half-precision HF checkpoints rebuilt from the demo model, and a
// table of corrupt inputs that must each give a one-line kvq::Error naming the file and field.
#include <gtest/gtest.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "kvq/model/model.hpp"
#include "model_test_util.hpp"

namespace kvq {
namespace {

using test::StEntry;
using test::StMap;
using test::TempDir;
namespace fs = std::filesystem;

const std::string kDemo = std::string(KVQ_SOURCE_DIR) + "/data/kvq-demo-llama";

at::Tensor demo_ids() { return at::tensor(std::vector<int64_t>{1, 390, 595, 604, 443, 476, 953, 394}, at::kLong); }

void copy_config(const std::string& dir) {
  fs::create_directories(dir);
  fs::copy_file(kDemo + "/config.json", dir + "/config.json");
}

// Max |a - b| over all elements.
float max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<float>(); }

TEST(Sharded, TwoShardsGiveBitIdenticalLogits) {
  TempDir tmp;
  const StMap all = test::st_read(kDemo + "/model.safetensors");
  StMap shard[2];
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  int i = 0;
  for (const auto& [name, t] : all) {  // alternate, so each shard holds parts of every layer
    const int s = i++ % 2;
    shard[s][name] = t;
    index["weight_map"][name] = "model-0000" + std::to_string(s + 1) + "-of-00002.safetensors";
  }
  const std::string dir = tmp / "sharded";
  copy_config(dir);
  test::write_bytes(dir + "/model-00001-of-00002.safetensors", test::st_serialize(shard[0]));
  test::write_bytes(dir + "/model-00002-of-00002.safetensors", test::st_serialize(shard[1]));
  test::write_bytes(dir + "/model.safetensors.index.json", index.dump());

  const Model ref = Model::load(kDemo);
  const Model sharded = Model::load(dir);
  EXPECT_TRUE(at::equal(ref.forward(demo_ids()), sharded.forward(demo_ids())));
}

// Each F32 weight rounded to `dtype`: `as_half` stores the half bits, `as_f32` the same rounded
// values as F32. Converting halves to fp32 is exact, so both files must give identical logits.
void write_rounded(const std::string& dtype, const std::string& half_dir, const std::string& f32_dir) {
  const StMap all = test::st_read(kDemo + "/model.safetensors");
  StMap half, f32;
  for (const auto& [name, t] : all) {
    const auto v = test::as_floats(t);
    StEntry h;
    h.dtype = dtype;
    h.shape = t.shape;
    h.bytes.resize(v.size() * 2);
    std::vector<float> back(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      uint16_t bits;
      if (dtype == "F16") {
        const c10::Half x(v[i]);
        bits = x.x;
        back[i] = float(x);
      } else {
        const c10::BFloat16 x(v[i]);  // round to nearest even, as torch's .to(bfloat16)
        bits = x.x;
        back[i] = float(x);
      }
      std::memcpy(&h.bytes[2 * i], &bits, 2);
    }
    half[name] = h;
    f32[name] = test::f32_entry(t.shape, back);
  }
  copy_config(half_dir);
  copy_config(f32_dir);
  test::write_bytes(half_dir + "/model.safetensors", test::st_serialize(half));
  test::write_bytes(f32_dir + "/model.safetensors", test::st_serialize(f32));
}

// Tolerances: demo logits are O(10). F16 keeps 11 significant bits (relative rounding 2^-12), BF16
// 8 bits (2^-9); the measured max drift over these 8 positions is 0.004 (F16) and 0.03 (BF16), so
// the bounds below leave a 5x margin while still catching a wrong conversion (which moves logits
// by whole units).
void check_rounded(const std::string& dtype, float tol) {
  TempDir tmp;
  write_rounded(dtype, tmp / "half", tmp / "f32");
  const Model half = Model::load(tmp / "half");
  const Model rounded = Model::load(tmp / "f32");
  const Model ref = Model::load(kDemo);
  const at::Tensor lh = half.forward(demo_ids());
  EXPECT_TRUE(at::equal(lh, rounded.forward(demo_ids()))) << dtype << " conversion is not exact";
  const float diff = max_diff(lh, ref.forward(demo_ids()));
  EXPECT_LT(diff, tol) << dtype;
  std::cout << "[ info ] " << dtype << " vs F32 max |logit diff| = " << diff << "\n";
  // The prompt's next-token prediction is unchanged (reference margin 0.66).
  EXPECT_EQ(lh[0][3].argmax().item<int64_t>(), 443);
}

TEST(HalfPrecision, F16) { check_rounded("F16", 0.02f); }
TEST(HalfPrecision, BF16) { check_rounded("BF16", 0.15f); }

// ---- corrupt inputs --------------------------------------------------------------------------

class BadHf : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_ / "m";
    config_ = test::tiny_config(spec_);
    tensors_ = test::tiny_weights(spec_);
  }
  void write() { test::write_hf_dir(dir_, config_, tensors_); }
  std::string st() const { return dir_ + "/model.safetensors"; }
  void expect(const std::vector<std::string>& parts) {
    test::expect_error([&] { Model::load(dir_); }, parts);
  }
  TempDir tmp_;
  test::TinySpec spec_;
  std::string dir_;
  nlohmann::json config_;
  StMap tensors_;
};

TEST_F(BadHf, TinyModelLoads) {
  write();
  const Model m = Model::load(dir_);
  const at::Tensor logits = m.forward(at::tensor(std::vector<int64_t>{1, 5, 9}, at::kLong));
  EXPECT_EQ(logits.sizes(), (at::IntArrayRef{1, 3, 40}));
  EXPECT_TRUE(at::isfinite(logits).all().item<bool>());
}

TEST_F(BadHf, TruncatedData) {
  write();
  const std::string bytes = test::read_bytes(st());
  test::write_bytes(st(), bytes.substr(0, bytes.size() - 100));
  expect({"model.safetensors", "tensor '", "past the end"});
}

TEST_F(BadHf, TruncatedBelowHeaderLength) {
  write();
  test::write_bytes(st(), std::string("\x10\x00\x00", 3));
  expect({"model.safetensors", "header length", "truncated"});
}

TEST_F(BadHf, HeaderLengthPastEof) {
  write();
  std::string bytes = test::read_bytes(st());
  bytes[6] = '\x01';  // header length ~2^48
  test::write_bytes(st(), bytes);
  expect({"model.safetensors", "header length", "past the end"});
}

TEST_F(BadHf, HeaderNotJson) {
  write();
  test::write_bytes(st(), test::st_pack(nlohmann::json("x"), "").replace(8, 3, "{{{"));
  expect({"model.safetensors", "header"});
}

TEST_F(BadHf, DtypeDisagreesWithByteCount) {
  tensors_["model.layers.1.self_attn.k_proj.weight"].dtype = "F16";  // F32 bytes labelled F16
  write();
  expect({"model.safetensors", "model.layers.1.self_attn.k_proj.weight", "F16", "needs"});
}

TEST_F(BadHf, UnsupportedDtype) {
  tensors_["model.norm.weight"].dtype = "I32";
  write();
  expect({"model.safetensors", "model.norm.weight", "I32"});
}

TEST_F(BadHf, ShapeDisagreesWithConfig) {
  auto& t = tensors_["model.layers.0.mlp.down_proj.weight"];
  std::swap(t.shape[0], t.shape[1]);  // same bytes, transposed shape
  write();
  expect({"model.safetensors", "model.layers.0.mlp.down_proj.weight", "[24,16]", "[16,24]"});
}

TEST_F(BadHf, DataOffsetsPastEof) {
  write();
  nlohmann::json header = nlohmann::json::object();
  header["model.norm.weight"] = {{"dtype", "F32"}, {"shape", {16}}, {"data_offsets", {0, 64}}};
  test::write_bytes(st(), test::st_pack(header, std::string(32, '\0')));
  expect({"model.safetensors", "model.norm.weight", "data_offsets", "past the end"});
}

TEST_F(BadHf, MissingConfigKey) {
  config_.erase("hidden_size");
  write();
  expect({"config.json", "hidden_size", "missing"});
}

TEST_F(BadHf, BadConfigValue) {
  config_["num_key_value_heads"] = 3;
  write();
  expect({"config.json", "num_key_value_heads", "3"});
}

TEST_F(BadHf, UnknownArchitecture) {
  config_["model_type"] = "gpt2";
  write();
  expect({"config.json", "model_type", "gpt2"});
}

TEST_F(BadHf, UnknownArchitectureClass) {
  config_.erase("model_type");
  config_["architectures"] = {"FalconForCausalLM"};
  write();
  expect({"config.json", "architectures", "FalconForCausalLM"});
}

TEST_F(BadHf, ArchitectureFromClassName) {
  config_.erase("model_type");
  config_["architectures"] = {"MistralForCausalLM"};
  write();
  EXPECT_EQ(Model::load(dir_).config().architecture, "mistral");
}

TEST_F(BadHf, UnsupportedRopeScaling) {
  config_["rope_scaling"] = {{"type", "longrope"}, {"factor", 2.0}};
  write();
  expect({"config.json", "rope_scaling.type", "longrope"});
}

TEST_F(BadHf, MissingTensor) {
  tensors_.erase("model.layers.1.self_attn.k_proj.weight");
  write();
  expect({"model.safetensors", "model.layers.1.self_attn.k_proj.weight", "missing"});
}

TEST_F(BadHf, MissingLmHeadWhenUntied) {
  tensors_.erase("lm_head.weight");
  write();
  expect({"model.safetensors", "lm_head.weight"});
}

TEST_F(BadHf, MissingQwen2Bias) {
  config_["model_type"] = "qwen2";
  write();  // a llama-shaped checkpoint has no q/k/v biases
  expect({"model.safetensors", "model.layers.0.self_attn.q_proj.bias", "missing"});
}

TEST_F(BadHf, MissingConfigJson) {
  write();
  fs::remove(dir_ + "/config.json");
  expect({"config.json", "missing"});
}

TEST_F(BadHf, NoWeightsFile) {
  write();
  fs::remove(st());
  expect({"model.safetensors", "missing"});
}

TEST_F(BadHf, ShardIndexProblems) {
  write();
  fs::rename(st(), dir_ + "/a.safetensors");
  nlohmann::json index = {{"weight_map", nlohmann::json::object()}};
  for (const auto& [name, t] : tensors_) index["weight_map"][name] = "a.safetensors";
  index["weight_map"].erase("model.norm.weight");
  test::write_bytes(dir_ + "/model.safetensors.index.json", index.dump());
  expect({"model.safetensors.index.json", "model.norm.weight", "weight_map"});

  index["weight_map"]["model.norm.weight"] = "b.safetensors";
  test::write_bytes(dir_ + "/model.safetensors.index.json", index.dump());
  expect({"model.safetensors.index.json", "model.norm.weight", "b.safetensors"});

  index["weight_map"]["model.norm.weight"] = "../a.safetensors";
  test::write_bytes(dir_ + "/model.safetensors.index.json", index.dump());
  expect({"model.safetensors.index.json", "model.norm.weight", "../a.safetensors"});
}

TEST(BadPath, MissingModelPath) {
  test::expect_error([] { Model::load("/nonexistent/kvq/model"); }, {"/nonexistent/kvq/model"});
}

// ---- llama2.c ------------------------------------------------------------------------------

// A tiny valid llama2.c v0 checkpoint: dim 8, hidden 12, 2 layers, 2 heads, 1 KV head,
// vocab `vocab` (negative: separate classifier), seq_len 16. Values are small and deterministic.
std::string tiny_llama2c(int32_t vocab) {
  const int32_t h[7] = {8, 12, 2, 2, 1, vocab, 16};
  const int64_t D = 8, Hd = 12, L = 2, V = std::abs(vocab), kvd = 4, S = 16, hd = 4;
  const int64_t floats = V * D + L * D + L * D * D + 2 * L * kvd * D + L * D * D + L * D + 3 * L * Hd * D +
                         D + 2 * S * (hd / 2) + (vocab < 0 ? V * D : 0);
  std::string bytes(reinterpret_cast<const char*>(h), sizeof h);
  for (int64_t i = 0; i < floats; ++i) {
    const float x = 0.05f * float((i * 37) % 41 - 20) / 20.f + 0.02f;
    bytes.append(reinterpret_cast<const char*>(&x), 4);
  }
  return bytes;
}

TEST(Llama2c, TinyCheckpointsLoad) {
  TempDir tmp;
  test::write_bytes(tmp / "shared.bin", tiny_llama2c(32));
  test::write_bytes(tmp / "unshared.bin", tiny_llama2c(-32));
  const Model a = Model::load(tmp / "shared.bin");
  const Model b = Model::load(tmp / "unshared.bin");
  EXPECT_TRUE(a.config().tie_word_embeddings);
  EXPECT_FALSE(b.config().tie_word_embeddings);
  EXPECT_EQ(b.config().vocab_size, 32);
  EXPECT_EQ(a.forward(at::tensor(std::vector<int64_t>{1, 2, 3}, at::kLong)).sizes(), (at::IntArrayRef{1, 3, 32}));
}

TEST(Llama2c, Truncated) {
  TempDir tmp;
  const std::string good = tiny_llama2c(32);
  test::write_bytes(tmp / "cut.bin", good.substr(0, good.size() - 4));
  test::expect_error([&] { Model::load(tmp / "cut.bin"); }, {"cut.bin", "file size", "implies"});
  test::write_bytes(tmp / "header.bin", good.substr(0, 20));
  test::expect_error([&] { Model::load(tmp / "header.bin"); }, {"header.bin", "header", "truncated"});
  // A shared-classifier file labelled as unshared is short by one classifier.
  std::string flipped = good;
  const int32_t neg = -32;
  std::memcpy(&flipped[20], &neg, 4);
  test::write_bytes(tmp / "flipped.bin", flipped);
  test::expect_error([&] { Model::load(tmp / "flipped.bin"); }, {"flipped.bin", "file size"});
}

TEST(Llama2c, BadHeaderFields) {
  TempDir tmp;
  std::string bytes = tiny_llama2c(32);
  const int32_t bad = -3;
  std::memcpy(&bytes[8], &bad, 4);  // n_layers
  test::write_bytes(tmp / "layers.bin", bytes);
  test::expect_error([&] { Model::load(tmp / "layers.bin"); }, {"layers.bin", "n_layers", "-3"});
  bytes = tiny_llama2c(32);
  const int32_t three = 3;
  std::memcpy(&bytes[12], &three, 4);  // n_heads 3 does not divide dim 8
  test::write_bytes(tmp / "heads.bin", bytes);
  test::expect_error([&] { Model::load(tmp / "heads.bin"); }, {"heads.bin", "n_heads"});
  bytes = tiny_llama2c(32);
  const uint32_t magic = 0x616b3432u;
  std::memcpy(&bytes[0], &magic, 4);
  test::write_bytes(tmp / "v1.bin", bytes);
  test::expect_error([&] { Model::load(tmp / "v1.bin"); }, {"v1.bin", "magic"});
}

TEST(Forward, RejectsOutOfVocabularyIds) {
  const Model m = Model::load(kDemo);
  test::expect_error([&] { m.forward(at::tensor(std::vector<int64_t>{1, 1024}, at::kLong)); }, {"ids", "1024"});
  test::expect_error([&] { m.forward(at::tensor(std::vector<int64_t>{-1}, at::kLong)); }, {"ids", "-1"});
}

}  // namespace
}  // namespace kvq
