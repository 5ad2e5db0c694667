#pragma once
// The forward's kernels, apart from the layer loop that calls them (parts/decoder_layer.cpp): RoPE tables and
// the one fp32 RoPE kernel, RMSNorm, the per-forward Workspace, causal/sliding-window attention
// (plain and with a protected cache). Internal to kvq_model.
#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvq/model/config.hpp"
#include "weights.hpp"

namespace kvq::detail {

// af * cos/sin of pos * inv_freq[i] for every position and rotary block: [seq][d_r/2]. The
// inverse rotation uses 1/af, so that rotating back undoes the attention factor too.
struct RopeTable {
  int half = 0;
  std::vector<float> cos, sin;
};

RopeTable make_rope_table(const int64_t* positions, int seq, const RopeParams& rp, bool inverse);

// x: [n_windows][seq][rows_per_pos][head_dim]. The forward's single RoPE kernel (fp32): the
// forward and apply_rope both run it, so they agree bit for bit.
void rope_rows(float* x, int64_t n_windows, int seq, int64_t rows_per_pos, int head_dim,
               const RopeTable& tab, RopePairing pairing, bool inverse);

// out = x / rms(x) * w over the last dim of contiguous [N, D] tensors.
void rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, at::Tensor& out);

// Buffers of one forward call, allocated once and reused by every layer (fresh multi-MB
// allocations would otherwise page-fault in each layer).
struct Workspace {
  at::Tensor h, qkv, q, k, v, attn, gate_up, act;  // per token
  at::Tensor qh, kh, vh, scores, probs, out;       // attention, per chunk of windows
  at::Tensor mask_diag;                            // [tb*G, tb] additive causal mask
  // Protected cache only (ensure_protected): the coded K/V beside the full ones.
  at::Tensor kq, vq, khq, vhq, scores_q, probs_q;
  at::Tensor moe_x, moe_gate_up, moe_act, moe_out;  // MoE: the rows routed to one expert
  at::Tensor shared_gate_up, shared_act;            // DeepSeekMoE's shared experts
  at::Tensor attn_gate;  // Qwen3.5's attention output gate [N, H d] (ModelConfig::attn_output_gate)
  // Gated DeltaNet (parts/gated_delta.hpp): the fused projection [N, conv_dim + Vd + 2 Hv], the
  // convolved q/k/v [N, conv_dim] and the output [N, Vd].
  at::Tensor gdn_proj, gdn_conv, gdn_out;
  // MLA: q_a (q-LoRA's normed rank), q_full [N, H (nope + rope)], per-head [H, N, .] operands of the
  // W_UK / W_UV absorption, and o_in [N, H v] (o_proj's input).
  at::Tensor mla_qa, mla_q, mla_nope, mla_lat, mla_out, mla_o;
  // BF16 precision: the GEMM operands rounded to BF16 and the BF16 products (flat, grown on first
  // use to the largest product of the layers; linear() below).
  at::Tensor bf16_in, bf16_out;
  int64_t batch = 0, seq = 0, chunk = 1, tb = 1;

  Workspace(const ModelConfig& c, int64_t B, int64_t T);
  // The coded K/V buffers of a protected cache, allocated on first use.
  void ensure_protected();
};

// The model's cached Workspace for the duration of one forward when it is free (an atomic flag,
// not a mutex, because an observer may call forward re-entrantly), else a private one.
class WorkspaceLease {
 public:
  WorkspaceLease(ModelWeights& w, const ModelConfig& c, int64_t B, int64_t T)
      : w_(w), owned_(!w.scratch_busy.exchange(true)) {
    if (owned_) ws_ = std::static_pointer_cast<Workspace>(w.scratch);
    if (!ws_ || ws_->batch != B || ws_->seq != T) {
      ws_.reset();
      if (owned_) w.scratch.reset();  // free the old buffers before allocating new ones
      ws_ = std::make_shared<Workspace>(c, B, T);
      if (owned_) w.scratch = ws_;
    }
  }
  ~WorkspaceLease() {
    if (owned_) w_.scratch_busy.store(false);
  }
  WorkspaceLease(const WorkspaceLease&) = delete;
  WorkspaceLease& operator=(const WorkspaceLease&) = delete;
  Workspace& get() { return *ws_; }

 private:
  ModelWeights& w_;
  bool owned_;
  std::shared_ptr<Workspace> ws_;
};

// The projections of the forward. W is [out, in], fp32 or BF16 (ModelWeights' precision).
// fp32 W: out = in · Wᵀ (+ b) in fp32, at::mm_out / addmm_out as before. BF16 W: `in` rounded to
// BF16 (nearest even), LibTorch's BF16 GEMM (oneDNN: fp32 accumulation, a BF16 product), the product
// widened into `out` and the fp32 bias added. in, out: contiguous fp32 [N, in] / [N, out].
void linear(Workspace& ws, at::Tensor& out, const at::Tensor& in, const at::Tensor& W, const at::Tensor& b = {});
// x += in · Wᵀ (fp32 W: x.addmm_ as before; BF16 W: the widened BF16 product added).
void linear_add(Workspace& ws, at::Tensor& x, const at::Tensor& in, const at::Tensor& W);
// The logits h · headᵀ [N, V] in fp32: a BF16 head is widened to fp32 a block of rows at a time,
// so the logits are not rounded to BF16 (KL and perplexity read them).
at::Tensor head_logits(const at::Tensor& h, const at::Tensor& head);

// Causal attention of ws.q (post-RoPE, [B*T, H*d]) over ws.k ([B*T, Hkv*d]) and ws.v
// ([B*T, Hkv*dv], dv = c.v_dim()) into ws.attn ([B*T, H*dv]), logits scaled by c.attn_scale().
// The G query heads of a KV head are stacked as extra rows (t*G + g), so K and V are never
// repeated and each query block is a contiguous row range. window > 0: query i sees only keys
// j > i - window; a block whose keys all lie inside every row's window takes the plain causal path.
// sinks ([H] fp32, or undefined): head h's softmax gets exp(sinks[h]) in its denominator (gpt-oss),
// p_j = softmax_j · sigmoid(logsumexp_j - sink), so its row sums to < 1.
void attention(Workspace& ws, int64_t B, int64_t T, const ModelConfig& c, int64_t window,
               const at::Tensor& sinks = {});

// attention() with a protected cache (see ProtectedKv): ws.kq, ws.vq hold the coded K (post-RoPE)
// and V. Pair (i, j) reads the coded side when sink <= j <= i - recent, else the full one. Per
// query block the full scores cover its keys k0..t1-1 as in attention(); the coded ones only the
// keys some row of the block reads coded, [c0, c1). The selected scores go through one softmax;
// the probabilities of coded pairs move to a second matrix, so that the output is
// P_full·V + P_coded·V_coded. A block without coded pairs is attention()'s block, unchanged.
void attention_protected(Workspace& ws, int64_t B, int64_t T, const ModelConfig& c, int64_t window, int64_t sink,
                         int64_t recent, const at::Tensor& sinks = {});

}  // namespace kvq::detail
