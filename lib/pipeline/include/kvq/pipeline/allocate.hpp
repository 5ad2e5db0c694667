#pragma once
// kvq-allocate's work: calibration file -> allocation file.
#include <cstdint>
#include <string>
#include <vector>

#include "kvq/format/decision.hpp"
#include "kvq/io/alloc_file.hpp"

namespace kvq {

enum class NormCorrectionMode { kOff, kOn, kAuto };

struct AllocateOptions {
  std::string calib;
  std::string out;
  std::string manifest_json;         // optional: also write the JSON manifest here
  Method method = Method::kBlockGtq;  // K
  double bpd = 3.0;
  Method v_method = Method::kUniform;
  double v_bpd = 0.0;                // 0: the K budget (rounded up to whole bits for uniform)
  uint64_t seed = 42;                // rotation / Hadamard sign seeds derive from it
  // TQ heads (uniform, block-gtq) decode rho~ Pi^T c/||c|| (HeadDecision::norm_correction):
  // kOn every TQ head, kOff none (version 1's decoding; --no-norm-correction), kAuto per
  // (layer, KV head, side) whichever codes the calibration reservoir with the lower error
  // (choose_norm_correction; a calibration without reservoir rows falls back to kOn, logged).
  // The default is kAuto: measured never worse than the better of on/off by more than 1.6 % on
  // any layer of the shared models, where "on" raises stories260K's (d = 8) K1/K2 layers.
  NormCorrectionMode norm_correction = NormCorrectionMode::kAuto;
  // TQ groups narrower than this many bits are coded unrotated (TqRotation::kIdentity); 0 or 1:
  // every group rotated (--rotate-below; the Block-GTQ reference uses 3).
  int rotate_below = 0;
  // TQ groups' scalar codebook (--codebook gaussian|exact): kSphere gives every TQ group of
  // 2..64 coordinates (kTqSphereMaxM) the Lloyd-Max codebook of the exact unit-sphere coordinate
  // law at its m, whatever its rotation (the law is exact for a Haar-rotated group and for a lone
  // RoPE pair whose phase the positions spread; for a wider unrotated group it is a model, as the
  // Gaussian one is); larger groups stay kGaussian (recorded per group). Needs a TQ method
  // (uniform or block-gtq) on K or V.
  TqCodebook codebook = TqCodebook::kGaussian;
  // TQ heads of >= 2 groups (Block-GTQ): one fp16 norm per group (kFp16), or one 16-bit record per
  // token (kCompact: the head norm as a level code plus the index of its group-norm ratio vector
  // in a 2^ratio_bits codebook fitted to the calibration reservoir, codec::fit_compact_group_norms),
  // so Block-GTQ stores exactly uniform TQ-MSE's side information (--group-norms, --ratio-bits).
  // kCompact needs reservoir rows; without them the heads keep fp16 norms (logged).
  enum class GroupNorms { kFp16, kCompact };
  GroupNorms group_norms = GroupNorms::kCompact;
  int ratio_bits = 8;
  int threads = 0;  // threads for the per-head fits (0 = all cores)
  // Block-GTQ
  int b_min = 1, b_max = 8;
  // Lloyd-Max MSE per width instead of 4^-b: with the Gaussian codebook lloyd_max_gaussian(b).mse;
  // with --codebook exact the sphere codebook's MSE at the group's m, found per head by the
  // fixed point of alloc::BlockGtqOptions::group_distortion.
  bool exact_distortion = false;
  // KV-COBRA
  int rounds = 5;
  double damping = 0.3;
  int64_t floor_abs = 4, floor_div = 4;  // B_min = max(floor_abs, floor(B/floor_div))
  std::string c1_rounding = "floor";     // floor | round
  std::string c2 = "kvq";                // cobra-mse/-kl damped C2: kvq (corrected rounding) | reference
  bool uncentered = false;               // basis from E[xx^T] instead of the covariance
  double q_constant = 1.0 / 12.0;        // q(b) = c 2^-2b
  int cobra_b_min = 2, cobra_b_max = 8;
  int r_min = 2;
  int measure_tokens = 1024;             // reservoir rows used by cobra-measured
  bool joint_kv = false;                 // one budget over K and V (COBRA exact)
  // layer-precision (--method and --v-method both): the (K, V) format combinations a layer may take,
  // "fp8,nvfp4[,fp8_k_nvfp4_v]", and what is minimised: "attention" (the attention error on the
  // reservoir: K's logit error through the softmax, V's attention-output error) or "mse" (reservoir MSE)
  std::string formats = "fp8,nvfp4";
  std::string objective = "attention";
  // vllm-turboquant: the presets to choose from ("all" or a list) and, when >= 0, the largest
  // total measured error (the fewest bytes that meet it) instead of the --bpd budget.
  std::string vllm_presets = "all";
  double max_error = -1.0;
  // vllm-turboquant: kvq-probe's file (.kvqprobe.json): choose by the measured end-to-end KL per
  // layer instead of the reservoir's attention error (max_error is then a KL: --max-kl).
  std::string probe;
  bool max_is_kl = false;  // the bound came as --max-kl (needs probe)
};

// Reads the calibration file, allocates, writes opts.out atomically; returns what was written.
AllocFile run_allocate(const AllocateOptions& opts);

}  // namespace kvq
