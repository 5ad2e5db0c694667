#include "moe.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace kvq::detail {

namespace {

// The softmax router: probabilities over every expert in fp32, top-k (DeepSeek-V2's
// group_limited_greedy: within the best groups), renormalised or scaled. Top-k ties go to the
// lower expert index (torch.topk leaves tie order unspecified; exact ties of fp32 router
// probabilities are rare).
void route_softmax(const Workspace& ws, const LayerWeights& L, const ModelConfig& c, std::vector<int32_t>& pick,
                   std::vector<float>& weight) {
  const int64_t N = ws.h.size(0), E = c.n_experts, K = c.n_experts_per_tok;
  const at::Tensor probs = at::softmax(at::mm(ws.h, L.router.t()), -1).contiguous();  // [N, E]
  const float* pp = probs.data_ptr<float>();
  // DeepSeek's group_limited_greedy: only experts of the topk_group groups with the highest best
  // probability compete (the others count as probability 0, as modeling_deepseek.py masks them).
  const int64_t n_group = c.n_group, group_size = n_group > 0 ? E / n_group : E;
  const bool scaled = !c.norm_topk_prob && c.routed_scaling_factor != 1.0;
  const float rsf = float(c.routed_scaling_factor);
  at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> order(static_cast<size_t>(E)), gorder(static_cast<size_t>(std::max<int64_t>(n_group, 1)));
    std::vector<float> gbest(gorder.size()), masked(static_cast<size_t>(E));
    for (int64_t t = begin; t < end; ++t) {
      const float* pr = pp + t * E;
      const float* score = pr;
      if (n_group > 0) {
        for (int64_t g = 0; g < n_group; ++g) {
          gbest[size_t(g)] = *std::max_element(pr + g * group_size, pr + (g + 1) * group_size);
          gorder[size_t(g)] = int32_t(g);
        }
        std::partial_sort(gorder.begin(), gorder.begin() + c.topk_group, gorder.end(), [&](int32_t a, int32_t b) {
          return gbest[size_t(a)] > gbest[size_t(b)] || (gbest[size_t(a)] == gbest[size_t(b)] && a < b);
        });
        std::fill(masked.begin(), masked.end(), 0.f);
        for (int64_t k = 0; k < c.topk_group; ++k) {
          const int64_t g = gorder[size_t(k)];
          std::copy(pr + g * group_size, pr + (g + 1) * group_size, masked.begin() + g * group_size);
        }
        score = masked.data();
      }
      for (int32_t e = 0; e < E; ++e) order[size_t(e)] = e;
      std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t a, int32_t b) {
        return score[a] > score[b] || (score[a] == score[b] && a < b);
      });
      float sum = 0;
      for (int64_t k = 0; k < K; ++k) sum += pr[order[size_t(k)]];
      for (int64_t k = 0; k < K; ++k) {
        const float p = pr[order[size_t(k)]];
        pick[size_t(t * K + k)] = order[size_t(k)];
        weight[size_t(t * K + k)] = c.norm_topk_prob ? p / sum : scaled ? p * rsf : p;
      }
    }
  });
}

// DeepSeek-V3's noaux_tc router (GLM-4.5's too), as the official Gate computes it: s = sigmoid of
// the router logits in fp32; the selection score s + e_score_correction_bias picks the experts
// (with n_group > 1, only from the topk_group groups whose two best selection scores sum highest;
// experts of other groups can never be picked), and the weights are the UNBIASED s of the picks,
// renormalised (norm_topk_prob) and times routed_scaling_factor. Ties go to the lower index.
void route_noaux(const Workspace& ws, const LayerWeights& L, const ModelConfig& c, std::vector<int32_t>& pick,
                 std::vector<float>& weight) {
  const int64_t N = ws.h.size(0), E = c.n_experts, K = c.n_experts_per_tok;
  const at::Tensor scores = at::sigmoid(at::mm(ws.h, L.router.t())).contiguous();  // [N, E]
  const float* sp = scores.data_ptr<float>();
  const float* bias = L.router_bias.data_ptr<float>();
  const int64_t n_group = std::max(c.n_group, 1), group_size = E / n_group;
  const int64_t keep_groups = c.n_group > 0 ? c.topk_group : 1;
  const float rsf = float(c.routed_scaling_factor);
  at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> order(static_cast<size_t>(E)), gorder(static_cast<size_t>(n_group));
    std::vector<float> sel(static_cast<size_t>(E)), gscore(static_cast<size_t>(n_group));
    std::vector<uint8_t> allowed(static_cast<size_t>(E));
    for (int64_t t = begin; t < end; ++t) {
      const float* s = sp + t * E;
      for (int64_t e = 0; e < E; ++e) sel[size_t(e)] = s[e] + bias[e];
      std::fill(allowed.begin(), allowed.end(), uint8_t(1));
      if (n_group > 1) {
        for (int64_t g = 0; g < n_group; ++g) {
          const float* b = sel.data() + g * group_size;
          float top1 = -std::numeric_limits<float>::infinity(), top2 = top1;
          for (int64_t e = 0; e < group_size; ++e) {
            if (b[e] > top1) {
              top2 = top1;
              top1 = b[e];
            } else if (b[e] > top2) {
              top2 = b[e];
            }
          }
          gscore[size_t(g)] = group_size > 1 ? top1 + top2 : top1;
          gorder[size_t(g)] = int32_t(g);
        }
        std::partial_sort(gorder.begin(), gorder.begin() + keep_groups, gorder.end(), [&](int32_t a, int32_t b) {
          return gscore[size_t(a)] > gscore[size_t(b)] || (gscore[size_t(a)] == gscore[size_t(b)] && a < b);
        });
        std::fill(allowed.begin(), allowed.end(), uint8_t(0));
        for (int64_t k = 0; k < keep_groups; ++k)
          std::fill_n(allowed.begin() + gorder[size_t(k)] * group_size, group_size, uint8_t(1));
      }
      int64_t n_allowed = 0;
      for (int64_t e = 0; e < E; ++e)
        if (allowed[size_t(e)]) order[size_t(n_allowed++)] = int32_t(e);
      std::partial_sort(order.begin(), order.begin() + K, order.begin() + n_allowed, [&](int32_t a, int32_t b) {
        return sel[size_t(a)] > sel[size_t(b)] || (sel[size_t(a)] == sel[size_t(b)] && a < b);
      });
      float sum = 0;
      for (int64_t k = 0; k < K; ++k) sum += s[order[size_t(k)]];
      for (int64_t k = 0; k < K; ++k) {
        const float w = s[order[size_t(k)]];
        pick[size_t(t * K + k)] = order[size_t(k)];
        weight[size_t(t * K + k)] = (c.norm_topk_prob ? w / sum : w) * rsf;
      }
    }
  });
}

// gpt-oss's router (HF GptOssTopKRouter, official MLPBlock): logits = W x + b in fp32, the top-k
// logits (ties to the lower index), softmaxed among themselves.
void route_topk_softmax(const Workspace& ws, const LayerWeights& L, const ModelConfig& c, std::vector<int32_t>& pick,
                        std::vector<float>& weight) {
  const int64_t N = ws.h.size(0), E = c.n_experts, K = c.n_experts_per_tok;
  const at::Tensor logits = at::addmm(L.router_b, ws.h, L.router.t()).contiguous();  // [N, E]
  const float* lp = logits.data_ptr<float>();
  at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> order(static_cast<size_t>(E));
    for (int64_t t = begin; t < end; ++t) {
      const float* z = lp + t * E;
      for (int32_t e = 0; e < E; ++e) order[size_t(e)] = e;
      std::partial_sort(order.begin(), order.begin() + K, order.end(),
                        [&](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
      const float m = z[order[0]];
      float sum = 0;
      for (int64_t k = 0; k < K; ++k) sum += std::exp(z[order[size_t(k)]] - m);
      for (int64_t k = 0; k < K; ++k) {
        pick[size_t(t * K + k)] = order[size_t(k)];
        weight[size_t(t * K + k)] = std::exp(z[order[size_t(k)]] - m) / sum;
      }
    }
  });
}

// gpt-oss's expert activation on gu = W_gu x + b_gu [n, 2 I] (rows interleaved: gate = gu[:, 0::2],
// up = gu[:, 1::2]) into act [n, I]: gate capped above at limit, up clamped to ±limit,
// act = gate · sigmoid(1.702 gate) · (up + 1).
void clamped_swiglu(at::Tensor& gu, at::Tensor& act, int64_t I, double limit) {
  const int64_t n = gu.size(0);
  at::Tensor pair = gu.view({n, I, 2});
  at::Tensor gate = pair.select(2, 0), up = pair.select(2, 1);
  gate.clamp_max_(limit);
  up.clamp_(-limit, limit).add_(1.0);
  act.copy_(gate).mul_(1.702).sigmoid_().mul_(gate).mul_(up);
}

}  // namespace

// x += Σ_kept p_e · SwiGLU_e(ws.h) for the top-k experts of each token. Only chosen experts run:
// the tokens routed to expert e are gathered, one GEMM chain per expert, scaled by their weights
// and added back in expert order.
void moe_mlp(Workspace& ws, const LayerWeights& L, const ModelConfig& c, at::Tensor& x) {
  const int64_t N = ws.h.size(0), E = c.n_experts, K = c.n_experts_per_tok, Ie = c.moe_intermediate_size;
  std::vector<int32_t> pick(size_t(N * K));
  std::vector<float> weight(size_t(N * K));
  const bool gpt_oss = c.swiglu_limit > 0;
  if (gpt_oss)
    route_topk_softmax(ws, L, c, pick, weight);
  else if (L.router_bias.defined())
    route_noaux(ws, L, c, pick, weight);
  else
    route_softmax(ws, L, c, pick, weight);
  // Tokens of each expert, in token order.
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(E));
  std::vector<std::vector<float>> wts(static_cast<size_t>(E));
  for (int64_t i = 0; i < N * K; ++i) {
    rows[size_t(pick[size_t(i)])].push_back(i / K);
    wts[size_t(pick[size_t(i)])].push_back(weight[size_t(i)]);
  }
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = int64_t(rows[size_t(e)].size());
    if (n == 0) continue;
    at::Tensor w_gate_up, w_down;  // a streamed layer's expert, converted for these tokens only
    if (L.expert_source) L.expert_source(int(e), &w_gate_up, &w_down);
    const at::Tensor& gate_up_w = L.expert_source ? w_gate_up : L.expert_gate_up[size_t(e)];
    const at::Tensor& down_w = L.expert_source ? w_down : L.expert_down[size_t(e)];
    const at::Tensor idx = at::from_blob(rows[size_t(e)].data(), {n}, at::kLong);
    const at::Tensor we = at::from_blob(wts[size_t(e)].data(), {n, 1}, at::kFloat);
    at::Tensor xe = ws.moe_x.narrow(0, 0, n), gu = ws.moe_gate_up.narrow(0, 0, n);
    at::Tensor act = ws.moe_act.narrow(0, 0, n), out = ws.moe_out.narrow(0, 0, n);
    at::index_select_out(xe, ws.h, 0, idx);
    if (gpt_oss) {  // biases inside: (W_d act(W_gu x + b_gu) + b_d) · w_e
      linear(ws, gu, xe, gate_up_w, L.expert_gate_up_b[e]);
      clamped_swiglu(gu, act, Ie, c.swiglu_limit);
      linear(ws, out, act, down_w, L.expert_down_b[e]);
    } else {
      linear(ws, gu, xe, gate_up_w);
      at::silu_out(act, gu.narrow(1, 0, Ie));
      act.mul_(gu.narrow(1, Ie, Ie));
      linear(ws, out, act, down_w);
    }
    out.mul_(we);
    x.index_add_(0, idx, out);
  }
  if (L.shared_gate_up.defined()) {  // DeepSeekMoE: x += shared(h), every token
    const int64_t Is = L.shared_down.size(1);
    linear(ws, ws.shared_gate_up, ws.h, L.shared_gate_up);
    at::silu_out(ws.shared_act, ws.shared_gate_up.narrow(1, 0, Is));
    ws.shared_act.mul_(ws.shared_gate_up.narrow(1, Is, Is));
    if (L.shared_gate.defined()) {  // Qwen-MoE: x += shared(h) · sigmoid(g · h); moe_out is free again
      linear(ws, ws.moe_out, ws.shared_act, L.shared_down);
      ws.moe_out.mul_(at::sigmoid(at::mm(ws.h, L.shared_gate.t())));
      x.add_(ws.moe_out);
    } else {
      linear_add(ws, x, ws.shared_act, L.shared_down);
    }
  }
}

}  // namespace kvq::detail
