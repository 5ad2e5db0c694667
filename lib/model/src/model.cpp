#include "kvq/model/model.hpp"

#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <dlfcn.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <limits>
#include <thread>
#include <vector>

#include "kvq/util/error.hpp"
#include "families/family.hpp"
#include "llama2c_header.hpp"
#include "mapped_file.hpp"
#include "parts/decoder_layer.hpp"
#include "parts/forward_kernels.hpp"
#include "weights.hpp"

namespace fs = std::filesystem;

namespace kvq {

// The layer loop below calls the family's layer (parts/decoder_layer.cpp) and its kernels.
using namespace detail;

Model::Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Model::~Model() = default;

Model Model::load(const std::string& path) { return load(path, LoadOptions{}); }

// The HF directory `path` names — itself, or the directory of a config.json / index / safetensors
// file inside one (such a file stands for its directory) — or "" for a llama2.c checkpoint.
static std::string hf_dir_of(const std::string& path) {
  const fs::path p(path);
  std::error_code ec;
  if (!fs::exists(p, ec)) throw Error(path, "", "no such file or directory");
  if (fs::is_directory(p)) return path;
  const std::string name = p.filename().string();
  if (name == "config.json" || name == "model.safetensors.index.json" || p.extension() == ".safetensors")
    return p.has_parent_path() ? p.parent_path().string() : ".";
  return "";
}

int64_t Model::whole_fp32_bytes(const std::string& path) { return whole_bytes(path, Precision::kFp32); }

int64_t Model::whole_bytes(const std::string& path, Precision p) {
  const std::string dir = hf_dir_of(path);
  std::error_code ec;
  ModelConfig c;
  if (dir.empty()) {
    if (p == Precision::kFp32) return int64_t(fs::file_size(path, ec));  // llama2.c: fp32 as stored
    std::string sha;
    const MappedFile f(path);
    c = llama2c_header_config(f, &sha);
  } else {
    c = detail::parse_hf_config(dir + "/config.json");
  }
  int64_t bytes = int64_t(c.hidden_size) * int64_t(sizeof(float));  // final norm
  for (int l = 0; l < c.decoder_layers(); ++l) bytes += ::kvq::layer_bytes(c, l, p);
  const int64_t elem = p == Precision::kBf16 ? 2 : int64_t(sizeof(float));
  const int64_t table = int64_t(c.vocab_size) * int64_t(c.hidden_size) * elem;
  return bytes + table * (c.tie_word_embeddings ? 1 : 2);
}

Model Model::load(const std::string& path, const LoadOptions& lo) {
  const std::string dir = hf_dir_of(path);
  Model m;
  m.w_ = std::make_unique<ModelWeights>();
  m.path_ = dir.empty() ? path : dir;
  m.precision_ = lo.precision;
  if (dir.empty()) {
    detail::load_llama2c(path, &m.config_, m.w_.get(), &m.config_sha256_);
    if (lo.precision == Precision::kBf16) {  // stored fp32: the GEMM weights rounded once loaded
      for (LayerWeights& L : m.w_->layers) to_precision(L, lo.precision);
      const bool tied = m.w_->lm_head.is_same(m.w_->embed);
      m.w_->embed = m.w_->embed.to(at::kBFloat16);
      m.w_->lm_head = tied ? m.w_->embed : m.w_->lm_head.to(at::kBFloat16);
    }
  } else {
    detail::load_hf(dir, &m.config_, m.w_.get(), &m.config_sha256_, lo.stream, lo.precision);
  }
  return m;
}

namespace {

// ids as a contiguous [B, T] int64 tensor, checked against the vocabulary.
at::Tensor checked_ids(const at::Tensor& ids_in, const ModelConfig& c, const std::string& path) {
  if (!ids_in.defined() || (ids_in.dim() != 1 && ids_in.dim() != 2) || ids_in.numel() == 0)
    throw Error(path, "ids", "expected a non-empty [T] or [B, T] tensor of token ids");
  if (ids_in.scalar_type() != at::kLong && ids_in.scalar_type() != at::kInt)
    throw Error(path, "ids", std::string("expected int64 token ids, got ") + c10::toString(ids_in.scalar_type()));
  at::Tensor ids = ids_in.to(at::kCPU, at::kLong).contiguous();
  if (ids.dim() == 1) ids = ids.unsqueeze(0);
  const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
  if (lo < 0 || hi >= c.vocab_size)
    throw Error(path, "ids", "token id " + std::to_string(lo < 0 ? lo : hi) + " is outside the vocabulary [0, " +
                                 std::to_string(c.vocab_size) + ")");
  return ids;
}

Pass make_pass(const at::Tensor& ids, const ModelConfig& c, int64_t pos0, const ModelWeights& w, float* hidden) {
  Pass p;
  p.B = ids.size(0);
  p.T = ids.size(1);
  p.positions.resize(size_t(p.T));
  for (int64_t t = 0; t < p.T; ++t) p.positions[size_t(t)] = pos0 + t;
  // `dynamic` RoPE depends on the length run: HF takes the largest position + 1.
  p.rope = make_rope_table(p.positions.data(), int(p.T), rope_params(c, pos0 + p.T), false);
  if (c.rope_local_theta > 0)  // Gemma 3: the local layers' own RoPE
    p.rope_local = make_rope_table(p.positions.data(), int(p.T), local_rope_params(c), false);
  const at::Tensor flat = ids.view({p.B * p.T});
  // The residual stream, a fresh copy of the embedding rows (gathered from the checkpoint when
  // streamed: the same fp32 values as the converted table's rows).
  at::Tensor e = w.source ? w.source->embed_rows(flat) : at::index_select(w.embed, 0, flat);
  if (e.scalar_type() != at::kFloat) e = e.to(at::kFloat);  // a BF16 table's rows, widened
  if (c.embed_multiplier > 0) e.mul_(c.embed_multiplier);   // Gemma: x sqrt(hidden) (a fresh tensor here)
  if (hidden) {
    p.x = at::from_blob(hidden, {p.B * p.T, int64_t(c.hidden_size)}, at::kFloat);
    p.x.copy_(e);
  } else {
    p.x = e;
  }
  return p;
}

// The layer the model's family computes (llama2.c checkpoints: the common decoder layer).
LayerFn layer_of(const ModelConfig& c) {
  const Family* f = find_family(c.architecture);
  return f ? f->layer : decoder_layer;
}

// Layer l's fp32 weights for the duration of one use: the resident ones, or converted from the
// checkpoint (and its stored pages dropped) when streamed.
class LayerLease {
 public:
  LayerLease(const ModelWeights& w, int l) : w_(w), l_(l) {
    if (w.source) w.source->build(l, &own_);
  }
  ~LayerLease() {
    if (w_.source) {
      own_ = LayerWeights{};
      w_.source->release(l_);
    }
  }
  LayerLease(const LayerLease&) = delete;
  LayerLease& operator=(const LayerLease&) = delete;
  const LayerWeights& get() const { return w_.source ? own_ : w_.layers[size_t(l_)]; }

 private:
  const ModelWeights& w_;
  int l_;
  LayerWeights own_;
};

}  // namespace

at::Tensor Model::forward(const at::Tensor& ids_in, const ForwardOptions& opts) const {
  c10::InferenceMode guard;
  const ModelConfig& c = config_;
  const at::Tensor ids = checked_ids(ids_in, c, path_);
  if (opts.pos0 < 0) throw Error(path_, "pos0", std::to_string(opts.pos0) + " is negative");
  if (opts.pos0 > 0 && c.hybrid())  // no recurrent state is carried between forwards
    throw Error(path_, "pos0", std::to_string(opts.pos0) + ": a hybrid decoder's Gated DeltaNet layers start from an "
                               "empty state, so a window must start at position 0");
  if (opts.protected_kv && (opts.protected_kv->sink < 0 || opts.protected_kv->recent < 0))
    throw Error(path_, opts.protected_kv->sink < 0 ? "sink" : "recent", "must be >= 0");
  const int64_t B = ids.size(0), T = ids.size(1);
  WorkspaceLease lease(*w_, c, B, T);
  Workspace& ws = lease.get();
  if (opts.protected_kv) ws.ensure_protected();

  Pass p = make_pass(ids, c, opts.pos0, *w_, nullptr);
  const LayerFn layer = layer_of(c);
  for (int l = 0; l < c.decoder_layers(); ++l) {
    const LayerLease L(*w_, l);
    layer(c, L.get(), l, ws, p, opts);
  }
  if (!opts.logits) return at::Tensor();
  rms_norm(p.x, w_->final_norm, c.rms_norm_eps, ws.h);
  const at::Tensor head = w_->source ? w_->source->lm_head() : w_->lm_head;
  return head_logits(ws.h, head).view({B, T, c.vocab_size});
}

at::Tensor Model::forward_from(int first, const at::Tensor& ids_in, const float* hidden, const ForwardOptions& opts) const {
  c10::InferenceMode guard;
  const ModelConfig& c = config_;
  const at::Tensor ids = checked_ids(ids_in, c, path_);
  if (first < 0 || first > c.decoder_layers())
    throw Error(path_, "first_layer", std::to_string(first) + " is outside 0.." + std::to_string(c.decoder_layers()));
  if (!hidden) throw Error(path_, "hidden", "the residual stream at the first layer's input is null");
  if (opts.pos0 < 0) throw Error(path_, "pos0", std::to_string(opts.pos0) + " is negative");
  if (opts.pos0 > 0 && c.hybrid())
    throw Error(path_, "pos0", std::to_string(opts.pos0) + ": a hybrid decoder's Gated DeltaNet layers start from an "
                               "empty state, so a window must start at position 0");
  if (opts.protected_kv) throw Error(path_, "protected_kv", "not with forward_from");
  const int64_t B = ids.size(0), T = ids.size(1);
  WorkspaceLease lease(*w_, c, B, T);
  Workspace& ws = lease.get();
  Pass p = make_pass(ids, c, opts.pos0, *w_, nullptr);  // positions, RoPE; its stream is replaced
  p.x.copy_(at::from_blob(const_cast<float*>(hidden), {B * T, int64_t(c.hidden_size)}, at::kFloat));
  const LayerFn layer = layer_of(c);
  for (int l = first; l < c.decoder_layers(); ++l) {
    const LayerLease L(*w_, l);
    layer(c, L.get(), l, ws, p, opts);
  }
  if (!opts.logits) return at::Tensor();
  rms_norm(p.x, w_->final_norm, c.rms_norm_eps, ws.h);
  const at::Tensor head = w_->source ? w_->source->lm_head() : w_->lm_head;
  return head_logits(ws.h, head).view({B, T, c.vocab_size});
}

void Model::forward_chunk(const std::vector<ChunkBatch>& batches, const ChunkHooks& hooks) const {
  c10::InferenceMode guard;
  const ModelConfig& c = config_;
  std::vector<Pass> passes;
  passes.reserve(batches.size());
  // One scratch per batch shape (a chunk holds at most a short first and last batch besides).
  std::vector<std::shared_ptr<Workspace>> ws(batches.size());
  std::vector<ForwardOptions> opts(batches.size());
  for (size_t i = 0; i < batches.size(); ++i) {
    const at::Tensor ids = checked_ids(batches[i].ids, c, path_);
    for (size_t k = 0; k < i && !ws[i]; ++k)
      if (ws[k]->batch == ids.size(0) && ws[k]->seq == ids.size(1)) ws[i] = ws[k];
    if (!ws[i]) ws[i] = std::make_shared<Workspace>(c, ids.size(0), ids.size(1));
    opts[i].observer = batches[i].observer;
    opts[i].logits = false;
    passes.push_back(make_pass(ids, c, 0, *w_, batches[i].hidden));
    if (hooks.after_step) hooks.after_step(i, -1);  // the embedding written
  }
  const LayerFn layer = layer_of(c);
  for (int l = 0; l < c.decoder_layers(); ++l) {
    {
      const LayerLease L(*w_, l);
      for (size_t i = 0; i < passes.size(); ++i) {
        layer(c, L.get(), l, *ws[i], passes[i], opts[i]);
        if (hooks.after_step) hooks.after_step(i, l);
      }
    }
    if (hooks.after_layer) hooks.after_layer(l);
  }
}

bool Model::streamed() const { return w_->source != nullptr; }

// Streamed, a MoE layer holds its routed experts in fp32 one at a time (hf.cpp's expert_source).
const std::vector<std::vector<float>>& Model::attention_sinks() const { return w_->sinks; }

int64_t Model::layer_fp32_bytes(int l) const { return ::kvq::layer_fp32_bytes(config_, l, streamed()); }

int64_t Model::layer_bytes(int l) const { return ::kvq::layer_bytes(config_, l, precision_, streamed()); }

int64_t Model::layer_stored_bytes(int l) const { return w_->source ? w_->source->stored_bytes(l) : 0; }

int64_t Model::workspace_bytes(const ModelConfig& c, int64_t B, int64_t T, Precision prec) {
  const int64_t N = B * T, H = c.n_heads, Hk = c.n_kv_heads, G = H / Hk, d = c.head_dim, dv = c.v_dim();
  // h, qkv, q, k, v, attn (Workspace's per-token buffers)
  int64_t f = N * (int64_t(c.hidden_size) + H * d + Hk * d + Hk * dv + H * dv);
  if (c.is_mla()) {
    const int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim, R = c.kv_lora_rank;
    f += N * ((c.q_lora_rank > 0 ? 2 * int64_t(c.q_lora_rank) : H * qk) + R + c.qk_rope_head_dim);
    f += N * (H * qk + H * c.qk_nope_head_dim + H * R + 2 * H * c.v_head_dim);
  } else {
    f += N * ((c.attn_output_gate ? 2 : 1) * H + 2 * Hk) * d;
    if (c.attn_output_gate) f += N * H * d;
  }
  if (c.hybrid())  // Gated DeltaNet: projection, convolved q/k/v, output
    f += N * (2 * int64_t(c.linear_conv_dim()) + 2 * int64_t(c.linear_v_dim()) + 2 * int64_t(c.linear_value_heads));
  bool any_dense = false, any_moe = false;
  for (int l = 0; l < c.decoder_layers(); ++l) (c.is_moe_layer(l) ? any_moe : any_dense) = true;
  if (any_dense) f += N * 3 * int64_t(c.intermediate_size);
  if (any_moe) f += N * (2 * int64_t(c.hidden_size) + 3 * int64_t(c.moe_intermediate_size));
  if (any_moe && c.shared_width() > 0) f += N * 3 * int64_t(c.shared_width());
  // Attention blocks (Workspace's chunk of windows and query blocks of tb positions).
  const int64_t tb = std::min<int64_t>(T, std::max<int64_t>(64, (T + 7) / 8));
  const int64_t per_window = H * tb * T * int64_t(sizeof(float));
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(B, (int64_t(4) << 20) / per_window));
  f += chunk * Hk * (T * G * d + T * d + T * dv + 2 * tb * G * T + tb * G * dv) + tb * G * tb;
  // The residual stream and one layer's transient products (the MLP's pre-activation copy, the
  // embedding gathered before it is copied).
  f += 2 * N * int64_t(c.hidden_size);
  int64_t bytes = f * int64_t(sizeof(float));
  if (prec == Precision::kBf16) {  // Workspace::bf16_in / bf16_out: the widest GEMM input and product
    const int64_t D = c.hidden_size, I = any_dense ? int64_t(c.intermediate_size) : 0;
    const int64_t Ie = any_moe ? int64_t(c.moe_intermediate_size) : 0, Is = any_moe ? int64_t(c.shared_width()) : 0;
    const int64_t qk = c.is_mla() ? c.qk_nope_head_dim + c.qk_rope_head_dim : 0;
    const int64_t qkv = c.is_mla() ? (c.q_lora_rank > 0 ? c.q_lora_rank : H * qk) + c.kv_lora_rank + c.qk_rope_head_dim
                                   : ((c.attn_output_gate ? 2 : 1) * H + 2 * Hk) * d;
    const int64_t gdn = c.hybrid() ? int64_t(c.linear_conv_dim()) + c.linear_v_dim() + 2 * int64_t(c.linear_value_heads) : 0;
    const int64_t in = std::max({D, H * dv, I, Ie, Is, int64_t(c.q_lora_rank), int64_t(c.linear_v_dim())});
    const int64_t out = std::max({qkv, D, 2 * I, 2 * Ie, 2 * Is, H * qk, gdn});
    bytes += N * (in + out) * 2;
  }
  return bytes;
}

int64_t layer_fp32_bytes(const ModelConfig& c, int l, bool one_expert) {
  return layer_bytes(c, l, Precision::kFp32, one_expert);
}

int64_t layer_bytes(const ModelConfig& c, int l, Precision prec, bool one_expert) {
  // The family's plan of the layer's tensors (a llama2.c checkpoint has the Llama layout's).
  const TensorIndex none;
  const Family* f = find_family(c.architecture);
  LayerPlan p = f ? f->layer_plan(c, l, none) : llama_plan(c, l, none);
  if (one_expert) p.erase(std::remove_if(p.begin(), p.end(), [](const Slot& s) { return s.expert > 0; }), p.end());
  return plan_bytes(p, prec);
}

void to_precision(LayerWeights& L, Precision p) {
  if (p != Precision::kBf16) return;
  auto cast = [](at::Tensor& t) {
    if (t.defined()) t = t.to(at::kBFloat16);
  };
  for (at::Tensor* t : {&L.wqkv, &L.wo, &L.w_gate_up, &L.w_down, &L.wq_b, &L.shared_gate_up, &L.shared_down}) cast(*t);
  for (at::Tensor& t : L.expert_gate_up) cast(t);
  for (at::Tensor& t : L.expert_down) cast(t);
}

const char* precision_name(Precision p) { return p == Precision::kBf16 ? "bf16" : "fp32"; }

bool cpu_has_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, cx = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid(1, a, b, cx, d);
  if (!(cx & (1u << 27))) return false;  // OSXSAVE: XGETBV is usable
  uint32_t xlo = 0, xhi = 0;
  __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
  (void)xhi;
  const bool avx512_state = (xlo & 0xE6u) == 0xE6u;  // XMM, YMM, opmask, ZMM_Hi256, Hi16_ZMM
  const bool amx_state = ((xlo >> 17) & 3u) == 3u;     // XTILECFG, XTILEDATA
  __cpuid_count(7, 0, a, b, cx, d);
  const bool amx_bf16 = (d >> 22) & 1u;
  const unsigned max_sub = a;
  bool avx512_bf16 = false;
  if (max_sub >= 1) {
    __cpuid_count(7, 1, a, b, cx, d);
    avx512_bf16 = (a >> 5) & 1u;
  }
  return (avx512_bf16 && avx512_state) || (amx_bf16 && amx_state);
#else
  return false;
#endif
}

Precision parse_precision(const std::string& s, const std::string& field) {
  if (s == "bf16") return Precision::kBf16;
  if (s == "fp32") return Precision::kFp32;
  if (s.empty() || s == "auto") return cpu_has_bf16() ? Precision::kBf16 : Precision::kFp32;
  throw Error("", field, "'" + s + "' is not a precision (bf16, fp32 or auto)");
}

Precision resolve_precision(const std::string& flag) {
  return flag.empty() ? default_precision() : parse_precision(flag);
}

Precision default_precision() {
  const char* e = std::getenv("KVQ_PRECISION");
  return parse_precision(e ? std::string(e) : std::string("auto"), "KVQ_PRECISION");
}

void apply_rope_windows(float* x, int64_t n_windows, int seq, int64_t rows_per_pos, int head_dim,
                        const int64_t* positions, const ModelConfig& cfg, bool inverse, int64_t rope_len, int layer) {
  KVQ_ASSERT(cfg.rotary_dim >= 2 && cfg.rotary_dim <= head_dim && cfg.rotary_dim % 2 == 0);
  if (seq <= 0 || n_windows <= 0) return;
  if (rope_len <= 0) rope_len = *std::max_element(positions, positions + seq) + 1;
  const RopeTable tab = make_rope_table(positions, seq, rope_params(cfg, rope_len, layer), inverse);
  rope_rows(x, n_windows, seq, rows_per_pos, head_dim, tab, cfg.pairing, inverse);
}

void apply_rope(float* x, int64_t rows_per_pos, int seq, int head_dim, const int64_t* positions,
                const ModelConfig& cfg, bool inverse, int64_t rope_len, int layer) {
  apply_rope_windows(x, 1, seq, rows_per_pos, head_dim, positions, cfg, inverse, rope_len, layer);
}

int set_threads(int n) {
  if (n <= 0) n = int(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(n);
  // ATen does not size OpenBLAS's own pool, which would otherwise spin on every core during GEMMs.
  using SetBlasThreads = void (*)(int);
  if (auto f = reinterpret_cast<SetBlasThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) f(n);
  return at::get_num_threads();
}

}  // namespace kvq
