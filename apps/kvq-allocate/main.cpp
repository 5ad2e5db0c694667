// kvq-allocate: calibration file + bits-per-dimension budget -> allocation file.
#include "kvq/cli/cli.hpp"
#include "kvq/util/atomic_file.hpp"
#include "kvq/pipeline/allocate.hpp"
#include "kvq/pipeline/allocation_methods.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "kvq-allocate: decide the bits of every (layer, KV head) of the KV cache from a calibration file.\n"
      "  kvq-allocate --calib cal.kvqcal.h5 --method block-gtq --bpd 3 --out a.kvqalloc.h5\n"
      "Methods (K): uniform (TQ-MSE at --bpd), block-gtq (bits per RoPE block by energy), cobra-mse /\n"
      "cobra-kl (rank x bits per head, C1 + damped C2), cobra-dp (C1 curves + exact C2), cobra-measured\n"
      "(D(r,b) measured on the reservoir with the real codec + exact C2). V: --v-method, --v-bpd.\n"
      "layer-precision (--method; --v-method follows it): FP8 or NVFP4 per layer for K and V, the least\n"
      "attention error (or --objective mse: reservoir MSE) with mean effective bits per dim <= --bpd (--formats "
      "fp8,nvfp4[,fp8_k_nvfp4_v]).\n"
      "vllm-turboquant (--method; --v-method follows it): the setting of vLLM's TurboQuant cache, measured\n"
      "with the engine's own codec: one preset (--presets) and the layers to keep in BF16 (always the\n"
      "engine's first 2 and last 2), the least attention error within --bpd (kept layers at 16 bits),\n"
      "or with --max-error X the fewest bytes whose error is <= X; with --probe P (kvq-probe) by the\n"
      "end-to-end KL measured on the model's forward (--max-kl X). kvq-export vllm-turboquant writes\n"
      "the vllm serve flags."};
  kvq::cli::Common common;
  kvq::cli::add_common(app, common);
  kvq::AllocateOptions o;
  std::string method = kvq::to_string(o.method), v_method = kvq::to_string(o.v_method);
  kvq::cli::add_calib(app, o.calib);
  app.add_option("--method", method, "K allocation method (" + kvq::allocation_method_names(kvq::Side::kK) + ")")
      ->default_val(method);
  kvq::cli::add_bpd(app, o.bpd, "--bpd", "K budget in bits per dimension (COBRA methods accept fractions)");
  auto* v_method_opt =
      app.add_option("--v-method", v_method,
                     "V allocation method (" + kvq::allocation_method_names(kvq::Side::kV) +
                         "; default with --method layer-precision / vllm-turboquant: the same)")
          ->default_val(v_method);
  app.add_option("--v-bpd", o.v_bpd, "V budget in bits per dimension (default: --bpd, rounded up for uniform)");
  kvq::cli::add_out(app, o.out, "output allocation file (.kvqalloc.h5), written atomically");
  app.add_option("--manifest", o.manifest_json, "also write the JSON manifest (schemas/allocation-manifest.schema.json)");
  std::string norm_correction = "auto";
  auto* nc_opt =
      app.add_option("--norm-correction", norm_correction,
                     "TQ heads decode rho * Pi^T c/||c|| (on), rho * Pi^T c (off: allocation version 1's codec), or "
                     "auto: per (layer, KV head, side) whichever codes the calibration reservoir with the lower "
                     "error (K: mean |q.k - q.k^| over reservoir query/key pairs, post-RoPE; V: MSE)")
          ->default_val(norm_correction)->check(CLI::IsMember({"on", "off", "auto"}));
  bool no_norm_correction = false;
  app.add_flag("--no-norm-correction", no_norm_correction, "same as --norm-correction off")->excludes(nc_opt);
  app.add_option("--rotate-below", o.rotate_below,
                 "TQ groups narrower than W bits are coded without rotation (0: rotate all; the Block-GTQ reference: 3)")
      ->default_val(o.rotate_below);
  std::string codebook = "gaussian";
  app.add_option("--codebook", codebook,
                 "TQ groups' scalar codebook: gaussian (Lloyd-Max for N(0, 1/m)) or exact (Lloyd-Max for the exact "
                 "coordinate law of a random unit vector in R^m, groups of 2..64 dims; larger ones stay gaussian). "
                 "Costs no bits; uniform and block-gtq only")
      ->default_val(codebook)->check(CLI::IsMember({"gaussian", "exact"}));
  std::string group_norms = "compact";
  app.add_option("--group-norms", group_norms,
                 "side information of TQ heads with >= 2 groups (block-gtq): fp16 (one fp16 norm per group) or "
                 "compact (one 16-bit record per token, as uniform stores: the head norm on a log scale plus the "
                 "index of its group-norm ratios in a 2^--ratio-bits codebook fitted to the calibration reservoir)")
      ->default_val(group_norms)->check(CLI::IsMember({"fp16", "compact"}));
  app.add_option("--ratio-bits", o.ratio_bits,
                 "compact group norms: bits of the ratio index (the head norm keeps 16 - k bits)")
      ->default_val(o.ratio_bits)->check(CLI::Range(1, 8));
  app.add_option("--seed", o.seed, "base seed of every rotation and Hadamard sign pattern")->default_val(o.seed);
  auto* g = app.add_option_group("Block-GTQ");
  g->add_option("--b-min", o.b_min, "smallest width per RoPE block")->default_val(o.b_min)->check(CLI::Range(1, 8));
  g->add_option("--b-max", o.b_max, "largest width per RoPE block / uniform width cap")->default_val(o.b_max)
      ->check(CLI::Range(1, 8));
  g->add_flag("--exact-distortion", o.exact_distortion,
              "use the Lloyd-Max MSE of each width instead of 4^-b in the greedy objective (with --codebook exact: "
              "the exact codebook's MSE at the size of the group each width forms, a per-head fixed point)");
  auto* c = app.add_option_group("KV-COBRA");
  c->add_option("--rounds", o.rounds, "damped C2 rounds")->default_val(o.rounds)->check(CLI::Range(0, 1000));
  c->add_option("--damping", o.damping, "damped C2 step factor")->default_val(o.damping);
  c->add_option("--floor-abs", o.floor_abs, "per-head budget floor B_min = max(floor-abs, B/floor-div)")
      ->default_val(o.floor_abs);
  c->add_option("--floor-div", o.floor_div, "see --floor-abs")->default_val(o.floor_div);
  c->add_option("--c1-rounding", o.c1_rounding, "C1 bits per rank: floor (r*b <= B) or round (reference mode)")
      ->default_val(o.c1_rounding)->check(CLI::IsMember({"floor", "round"}));
  c->add_option("--c2", o.c2,
                "cobra-mse/cobra-kl damped C2: kvq (its corrected integer rounding) or reference (the KV-COBRA "
                "reference code exactly: budget int(d*bpd) per head, r re-derived as B//b each round, int() "
                "truncations; add --uncentered for its basis)")
      ->default_val(o.c2)->check(CLI::IsMember({"kvq", "reference"}));
  c->add_flag("--uncentered", o.uncentered, "basis from E[x x^T] (reference code) instead of the covariance");
  c->add_option("--q-constant", o.q_constant, "c in the distortion model q(b) = c 2^-2b")->default_val(o.q_constant);
  c->add_option("--cobra-b-min", o.cobra_b_min, "smallest bits per kept coordinate")->default_val(o.cobra_b_min);
  c->add_option("--cobra-b-max", o.cobra_b_max, "largest bits per kept coordinate")->default_val(o.cobra_b_max);
  c->add_option("--measure-tokens", o.measure_tokens, "reservoir rows cobra-measured codes per candidate, and that --norm-correction auto codes per head")
      ->default_val(o.measure_tokens)->check(CLI::Range(1, 1 << 24));
  c->add_flag("--joint-kv", o.joint_kv, "split one budget (--bpd per dim of K and V) between K and V exactly (K and V of one dim)");
  auto* lp = app.add_option_group("layer-precision");
  lp->add_option("--formats", o.formats,
                 "(K, V) formats a layer may take, comma-separated: fp8 (both E4M3, 8 bits/dim), nvfp4 (both E2M1 + "
                 "E4M3 block scale, 4.5 bits/dim), fp8_k_nvfp4_v (K FP8, V NVFP4: ModelOpt's FP8_K_NVFP4_V)")
      ->default_val(o.formats);
  lp->add_option("--objective", o.objective,
                 "what the DP minimises on the reservoir: attention (K's post-RoPE logit error against the group's "
                 "queries carried through the softmax, plus V's attention-output error) or mse (reservoir MSE)")
      ->default_val(o.objective)->check(CLI::IsMember({"attention", "mse"}));
  auto* vt = app.add_option_group("vllm-turboquant");
  vt->add_option("--presets", o.vllm_presets,
                 "presets to choose from: all, or a comma-separated list of turboquant_k8v4, turboquant_4bit_nc, "
                 "turboquant_k3v4_nc, turboquant_3bit_nc")
      ->default_val(o.vllm_presets);
  auto* max_error_opt = vt->add_option("--max-error", o.max_error,
                 "instead of --bpd: the fewest bytes whose total measured error (--objective, summed over layers, "
                 "K and V) is <= this; the allocation records the error of the choice and of vLLM's default")
      ->check(CLI::NonNegativeNumber);
  vt->add_option("--probe", o.probe,
                 "kvq-probe's file (.kvqprobe.json): choose by the end-to-end KL measured on the model's forward "
                 "(each layer coded alone with each preset) instead of the reservoir's attention error");
  double max_kl = -1.0;
  auto* max_kl_opt = vt->add_option("--max-kl", max_kl,
                                    "with --probe, instead of --bpd: the fewest bytes whose summed per-layer KL is <= this")
                         ->check(CLI::NonNegativeNumber)
                         ->excludes(max_error_opt);
  KVQ_CLI_PARSE(app, argc, argv);
  if (max_kl_opt->count() > 0) {
    o.max_error = max_kl;
    o.max_is_kl = true;
  }
  kvq::cli::apply_common(common);
  return kvq::cli::run_main("kvq-allocate", [&] {
    o.norm_correction = no_norm_correction        ? kvq::NormCorrectionMode::kOff
                        : norm_correction == "on"  ? kvq::NormCorrectionMode::kOn
                        : norm_correction == "off" ? kvq::NormCorrectionMode::kOff
                                                   : kvq::NormCorrectionMode::kAuto;
    o.codebook = codebook == "exact" ? kvq::TqCodebook::kSphere : kvq::TqCodebook::kGaussian;
    o.threads = common.threads;
    o.group_norms = group_norms == "compact" ? kvq::AllocateOptions::GroupNorms::kCompact
                                             : kvq::AllocateOptions::GroupNorms::kFp16;
    o.method = kvq::allocation_method_from_flag("--method", method, kvq::Side::kK);
    // layer-precision decides K and V of a layer together: --v-method follows unless given.
    if ((o.method == kvq::Method::kLayerPrecision || o.method == kvq::Method::kVllmTurboQuant) &&
        v_method_opt->count() == 0)
      v_method = method;
    o.v_method = kvq::allocation_method_from_flag("--v-method", v_method, kvq::Side::kV);
    kvq::OutputBatch outputs;  // --out and --manifest together, or neither
    kvq::run_allocate(o);
    outputs.commit();
    return 0;
  });
}
