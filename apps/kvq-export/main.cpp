// kvq-export: write what kvq measured or decided in the serving engines' own files.
#include <cstdio>
#include <map>

#include "kvq/cli/cli.hpp"
#include "kvq/util/atomic_file.hpp"
#include "kvq/export/modelopt.hpp"
#include "kvq/export/vllm.hpp"
#include "kvq/export/vllm_turboquant.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "kvq-export: hand kvq's results to a serving engine (see README.md, \"Deploying: kvq-export\").\n"
      "  kvq-export vllm --calib cal.kvqcal.h5 --out kv/ [--strategy tensor|attn_head] [--margin M] [--tp N]\n"
      "      FP8 E4M3 KV-cache scales, scale = amax * margin / 448, from the calibration file's per-head\n"
      "      activation maxima: kv/kv_scales.safetensors (model.layers.{i}.self_attn.{k,v,q}_scale, F32),\n"
      "      kv/kv_cache_scheme.json (merge into config.json's quantization_config) and, with --tp N,\n"
      "      kv/kv_cache_scales.json (vLLM's --quantization-param-path file, every rank the same).\n"
      "  kvq-export modelopt --alloc lp.kvqalloc.h5 --out ckpt/\n"
      "      ckpt/hf_quant_config.json: per-layer FP8 / NVFP4 / FP8_K_NVFP4_V KV cache of a layer-precision\n"
      "      allocation.\n"
      "  kvq-export vllm-turboquant --alloc tq.kvqalloc.h5 [--out DIR]\n"
      "      the vllm serve arguments of a vllm-turboquant allocation, printed (stdout): --kv-cache-dtype\n"
      "      <preset> --kv-cache-dtype-skip-layers <kept layers>; with --out also DIR/vllm_serve_args.txt and\n"
      "      DIR/vllm_turboquant.json (the same, with the measured errors).\n"
      "  With --model M (an HF checkpoint directory) any of them writes --out DIR as a model directory the engine\n"
      "  loads as it is: M's files linked (--copy: copied), config.json with quantization_config.kv_cache_scheme\n"
      "  merged (vllm), hf_quant_config.json plus self_attn.{k,v}_proj.{k,v}_scale (modelopt), the scales in\n"
      "  kv_scales.safetensors and model.safetensors.index.json listing every tensor. DIR must not exist or\n"
      "  be empty; the calibration / allocation must come from M.\n"
      "Nothing is written when an input is refused (exit 2)."};
  kvq::cli::Common common;
  kvq::cli::add_common(app, common);
  app.require_subcommand(1);
  app.fallthrough();  // -v/-q/--threads also after the subcommand

  auto* vllm = app.add_subcommand("vllm", "FP8 KV-cache scales for vLLM / SGLang from a calibration file");
  std::string calib, vllm_out, strategy = "tensor", vllm_model, mo_model;
  bool vllm_copy = false, mo_copy = false;
  kvq::exporter::VllmOptions vo;
  kvq::cli::add_calib(*vllm, calib);
  kvq::cli::add_out(*vllm, vllm_out, "output directory (created if missing; with --model: new or empty)");
  vllm->add_option("--model", vllm_model, "HF checkpoint directory the calibration was made from: write --out as a "
                                          "model directory vLLM serves as it is");
  vllm->add_flag("--copy", vllm_copy, "with --model: copy the checkpoint's files instead of symlinking them");
  vllm->add_option("--strategy", strategy,
                   "tensor: one scale per layer for each of K, V, Q (max over heads); attn_head: one per head "
                   "(k/v [num_kv_heads], q [num_heads])")
      ->default_val("tensor")
      ->check(CLI::IsMember({"tensor", "attn_head"}));
  vllm->add_option("--margin", vo.margin, "headroom factor on every amax (> 0; > 1 leaves room above the calibration maximum)")
      ->default_val(1.0)
      ->check(CLI::PositiveNumber);
  vllm->add_option("--tp", vo.tp, "also write kv_cache_scales.json for this tensor-parallel size")
      ->check(CLI::Range(1, 65536));

  auto* mo = app.add_subcommand("modelopt", "ModelOpt hf_quant_config.json from a layer-precision allocation");
  std::string alloc, mo_out;
  kvq::cli::add_alloc(*mo, alloc);
  kvq::cli::add_out(*mo, mo_out, "output directory (created if missing; with --model: new or empty)");
  mo->add_option("--model", mo_model, "HF checkpoint directory the allocation was made for: write --out as a model "
                                      "directory with hf_quant_config.json and the scale tensors");
  mo->add_flag("--copy", mo_copy, "with --model: copy the checkpoint's files instead of symlinking them");

  auto* tq = app.add_subcommand("vllm-turboquant", "vllm serve flags (--kv-cache-dtype turboquant_*, "
                                                   "--kv-cache-dtype-skip-layers) from a vllm-turboquant allocation");
  std::string tq_alloc, tq_out, tq_model;
  bool tq_copy = false;
  kvq::cli::add_alloc(*tq, tq_alloc);
  tq->add_option("--out", tq_out, "also write DIR/vllm_serve_args.txt and DIR/vllm_turboquant.json (created if "
                                  "missing; with --model: new or empty)");
  tq->add_option("--model", tq_model, "HF checkpoint directory the allocation was made for: write --out as a model "
                                      "directory (its files linked) with the two files beside them");
  tq->add_flag("--copy", tq_copy, "with --model: copy the checkpoint's files instead of symlinking them");

  KVQ_CLI_PARSE(app, argc, argv);
  kvq::cli::apply_common(common);
  return kvq::cli::run_main("kvq-export", [&] {
    std::vector<std::string> written;
    std::string tq_line;  // vllm-turboquant: the serve arguments, printed once the files are in place
    kvq::OutputBatch outputs;  // the directory's files together, or none (and no new directory)
    if (vllm->parsed()) {
      vo.strategy = strategy == "attn_head" ? kvq::exporter::ScaleStrategy::kAttnHead : kvq::exporter::ScaleStrategy::kTensor;
      if (!vllm_model.empty())
        written = kvq::exporter::export_vllm_model(vllm_model, calib, vllm_out, vo, vllm_copy);
      else if (vllm_copy)
        throw kvq::Error("", "--copy", "needs --model (it copies the checkpoint's files)");
      else
        written = kvq::exporter::export_vllm(calib, vllm_out, vo);
    } else if (tq->parsed()) {
      if (!tq_model.empty() && tq_out.empty()) throw kvq::Error("", "--out", "needed with --model (the directory to write)");
      if (tq_copy && tq_model.empty()) throw kvq::Error("", "--copy", "needs --model (it copies the checkpoint's files)");
      written = kvq::exporter::export_vllm_turboquant(tq_alloc, tq_out, tq_model, tq_copy, &tq_line);
    } else {
      if (!mo_model.empty())
        written = kvq::exporter::export_modelopt_model(mo_model, alloc, mo_out, mo_copy);
      else if (mo_copy)
        throw kvq::Error("", "--copy", "needs --model (it copies the checkpoint's files)");
      else
        written = kvq::exporter::export_modelopt(alloc, mo_out);
    }
    outputs.commit();
    if (!tq_line.empty()) {
      std::printf("%s\n", tq_line.c_str());
      std::fflush(stdout);
    }
    for (const auto& f : written)
      if (!common.quiet) std::fprintf(stderr, "kvq-export: wrote %s\n", f.c_str());
    return 0;
  });
}
