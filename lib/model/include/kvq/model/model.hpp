#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvq/model/capture.hpp"
#include "kvq/model/config.hpp"

namespace kvq {

struct ModelWeights;  // defined in src/

// A protected KV cache in one forward. For query i, key/value j <= i is read in full precision
// when j < sink or j > i - recent (the last `recent` entries, the query's own token included) and
// coded otherwise -- what a decode loop's cache holds when every token is coded once, as written,
// and the sink and recent tokens are kept beside. At every layer the forward hands `code` a copy of
// the layer's pre-RoPE K/V (after any kv_transform) to code in place, ropes both, and each
// (query, key) pair of the attention takes its score and its value from the side the policy names.
// Each query's hidden state is then exactly its decode step's, layer by layer, so one forward is
// exact. Tokens before `sink` are never read coded: `code` may leave them as they are.
class ProtectedKv {
 public:
  virtual ~ProtectedKv() = default;
  virtual void code(LayerKv& kv) = 0;
  int sink = 0;
  int recent = 0;
};

// The forward's arithmetic. kFp32: every weight widened to fp32 and every GEMM in fp32 (what the
// float64 reference tests check to 1e-4). kBf16: the GEMM weights kept in BF16 (a BF16 checkpoint as
// shipped; FP8 / INT4 / MXFP4 ones dequantized to fp32 and rounded to BF16, as DeepSeek's
// fp8_cast_bf16 does; fp32 ones rounded) and the projections' inputs rounded to BF16 for LibTorch's
// BF16 GEMM (oneDNN, fp32 accumulation, BF16 result); the residual stream, norms, RoPE, attention,
// softmax, the router and the lm_head's logits stay fp32 (the head's BF16 weights are widened a
// block of rows at a time), so what a capture observes is fp32 arithmetic on BF16-rounded
// projections.
enum class Precision { kFp32, kBf16 };
const char* precision_name(Precision p);  // "fp32" / "bf16"
// True when this CPU multiplies BF16 natively: AVX512-BF16 or AMX-BF16 (CPUID), with the AVX-512
// (or AMX tile) state enabled by the OS (XGETBV).
bool cpu_has_bf16();
// "bf16", "fp32" or "auto" (bf16 when cpu_has_bf16(), else fp32); an empty string is "auto".
// Throws kvq::Error (field `field`) naming the value otherwise.
Precision parse_precision(const std::string& s, const std::string& field = "--precision");
// The --precision a tool uses when none is given: $KVQ_PRECISION if set (same spellings), else
// "auto". Throws like parse_precision naming the variable.
Precision default_precision();
// A tool's --precision: default_precision() when the flag was not given (empty), else the flag's.
Precision resolve_precision(const std::string& flag);

// A Llama-family decoder (Llama, Mistral, Qwen2, llama2.c) in LibTorch, inference only.
class Model {
 public:
  // `path` is an HF directory (config.json + model.safetensors or model.safetensors.index.json)
  // or a llama2.c .bin checkpoint. Throws kvq::Error naming the file and field on bad input.
  static Model load(const std::string& path);
  // stream: an HF checkpoint stays mapped in its stored dtype and each forward converts one layer
  // at a time to fp32, dropping the layer's pages before the next (a llama2.c checkpoint is small
  // and always loaded whole). Both loads compute the same fp32 values.
  struct LoadOptions {
    bool stream = false;
    Precision precision = Precision::kFp32;  // the library's default; the tools' is default_precision()
  };
  static Model load(const std::string& path, const LoadOptions& lo);
  // Bytes of the whole model in fp32 (what load(path) holds), from config.json alone (a llama2.c
  // checkpoint is fp32 already: its size). Throws like load on a missing path or a bad config.
  static int64_t whole_fp32_bytes(const std::string& path);
  // The same in the given precision: BF16 keeps 2 bytes per GEMM weight (norms, biases, routers and
  // MLA's kv_b stay fp32).
  static int64_t whole_bytes(const std::string& path, Precision p);

  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  ~Model();

  const ModelConfig& config() const { return config_; }
  const std::string& path() const { return path_; }
  Precision precision() const { return precision_; }
  // sha256 of config.json (HF) or of the llama2.c header bytes: identifies the architecture.
  const std::string& config_sha256() const { return config_sha256_; }
  // The attention sinks (gpt-oss), [n_layers][n_heads] as the forward uses them (fp32); empty when
  // the model has none.
  const std::vector<std::vector<float>>& attention_sinks() const;

  struct ForwardOptions {
    CaptureObserver* observer = nullptr;
    KvTransform* kv_transform = nullptr;
    ProtectedKv* protected_kv = nullptr;  // null: one K/V per position (the plain paths)
    bool logits = true;     // false: skip final norm + lm_head (capture-only passes)
    int64_t pos0 = 0;       // position of the first token
  };
  // ids: [B, T] int64 (or [T]); each row is one causal window. Returns logits [B, T, V] fp32
  // (undefined tensor when opts.logits is false).
  at::Tensor forward(const at::Tensor& ids, const ForwardOptions& opts) const;
  at::Tensor forward(const at::Tensor& ids) const { return forward(ids, ForwardOptions{}); }

  // The forward from layer `first` on (0 <= first <= n_layers), given the residual stream at its
  // input: hidden holds B*T*hidden_size floats, what forward_chunk leaves in ChunkBatch::hidden
  // after layer first - 1 (the embedding for first = 0). Layers before `first` are not run, so a
  // probe of layer l pays only for layers l.. (kvq/eval/probe.hpp). Given the stream forward(ids)
  // computes there, it returns exactly forward(ids, opts)'s logits (the same fp32 operations).
  at::Tensor forward_from(int first, const at::Tensor& ids, const float* hidden, const ForwardOptions& opts) const;

  // A layer-major forward of several batches (capture passes: no logits, no K/V hooks). Every
  // batch passes layer l before any enters l + 1, so a streamed model converts each layer once
  // for the whole chunk. Each batch computes exactly what forward(ids, {observer, logits=false})
  // computes for it (the same fp32 operations in the same order), and its observer sees the
  // layers in order; across batches the observers of layer l are called in batch order.
  struct ChunkBatch {
    at::Tensor ids;                      // [B, T] (or [T])
    CaptureObserver* observer = nullptr;
    float* hidden = nullptr;  // optional storage for the batch's residual stream, B*T*hidden_size floats
  };
  struct ChunkHooks {
    std::function<void(size_t batch, int layer)> after_step;  // after each batch's step (-1: embedding)
    std::function<void(int layer)> after_layer;               // after every batch passed layer l
  };
  void forward_chunk(const std::vector<ChunkBatch>& batches, const ChunkHooks& hooks = {}) const;

  bool streamed() const;
  // Memory of a streamed forward: the fp32 bytes of layer l as converted, its bytes in the
  // checkpoint (0 when loaded whole), and the scratch of one forward of B windows of T tokens. A
  // streamed MoE layer converts its routed experts one at a time: one expert's bytes count.
  int64_t layer_fp32_bytes(int l) const;
  int64_t layer_bytes(int l) const;  // layer_fp32_bytes in the model's precision (what a lease holds)
  int64_t layer_stored_bytes(int l) const;
  static int64_t workspace_bytes(const ModelConfig& c, int64_t B, int64_t T, Precision p = Precision::kFp32);

 private:
  Model();
  ModelConfig config_;
  std::string path_, config_sha256_;
  Precision precision_ = Precision::kFp32;
  std::unique_ptr<ModelWeights> w_;
};

// Applies RoPE in place to x [T][rows_per_pos][head_dim] (fp32, contiguous; rows_per_pos is
// usually the head count) at positions[T]; inverse rotates back (and divides out the attention
// factor). The same fp32 kernel the forward uses, so results match it bit for bit (the double
// reference of one vector is codec::reference_apply_rope; both pair coordinates as
// kvq/format/rope.hpp says). Uses cfg.rotary_dim, cfg.pairing and rope_params(cfg, rope_len); dims
// at or past rotary_dim are left untouched. rope_len is the length of the forward the positions
// belong to (only `dynamic` RoPE depends on it); <= 0 means the largest position + 1. layer >= 0:
// that layer's RoPE (Gemma 3's local layers have their own: rope_params(cfg, len, layer)).
void apply_rope(float* x, int64_t rows_per_pos, int seq, int head_dim, const int64_t* positions,
                const ModelConfig& cfg, bool inverse = false, int64_t rope_len = 0, int layer = -1);
// The same for n_windows windows laid out [n_windows][T][rows_per_pos][head_dim] that share
// positions[T] (the layout of LayerCapture / LayerKv).
void apply_rope_windows(float* x, int64_t n_windows, int seq, int64_t rows_per_pos, int head_dim,
                        const int64_t* positions, const ModelConfig& cfg, bool inverse = false,
                        int64_t rope_len = 0, int layer = -1);

// Sets LibTorch intra-op threads (n <= 0: all cores). Returns the count set.
int set_threads(int n);

}  // namespace kvq
