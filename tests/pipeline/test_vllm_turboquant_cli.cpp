// kvq-allocate --method vllm-turboquant and kvq-export vllm-turboquant end to end on tiny models
// written by kvq-make-tiny-hf (8 layers, so vLLM's boundary rule keeps 0, 1, 6, 7 and leaves four
// layers to choose): the allocation holds coding kind vllm-turboquant decisions that spell one
// preset and a kept set containing the engine's forced layers; the exported serve flags are the
// ones those decisions spell (read back from the file here, not from the tool's summary); kvq-verify
// codes the allocation (every layer kept in BF16 is far closer to the model than the 3-bit preset);
// what the engine refuses (a head dim that is not a power of two, MLA, a budget below the forced
// layers, an error bound nothing meets) is one line each.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <nlohmann/json.hpp>

#include "kvq/codec/vllm_turboquant.hpp"
#include "kvq/io/alloc_file.hpp"
#include "pipeline_fixture.hpp"
#include "run_cmd.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;
using kvq::test::bin;
using kvq::test::run_cmd;
using kvq::test::temp_path;

namespace {

// A tiny model of `family` and its calibration (cached per name).
std::string capture(const std::string& name, const std::string& family, const std::string& shape) {
  const std::string dir = temp_path("vllm_tq_" + name);
  const std::string cal = dir + "/c.kvqcal.h5";
  if (fs::exists(cal)) return cal;
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto r = run_cmd(std::string(KVQ_MAKE_TINY_HF) + " --family " + family + " --seed 3 " + shape + " --out " + dir + "/m");
  EXPECT_EQ(r.status, 0) << r.err;
  {
    std::mt19937 rng(2);
    const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "from"};
    std::ofstream c(dir + "/c.txt");
    for (int i = 0; i < 4000; ++i) c << words[rng() % 12] << (i % 17 == 16 ? ".\n" : " ");
  }
  r = run_cmd(bin("calib-capture") + " -q --threads 1 --model " + dir + "/m --corpus " + dir + "/c.txt" +
              " --samples 4 --seq-len 64 --holdout 2 --reservoir-tokens 128 --out " + cal);
  EXPECT_EQ(r.status, 0) << r.err;
  return cal;
}

std::string qwen3_cal() { return capture("qwen3", "qwen3", "--layers 8 --head-dim 32 --kv-heads 2"); }

struct Spelled {
  std::string preset;
  std::vector<int> kept;
};

// The preset and kept layers the file's decisions spell, read here from the heads.
Spelled spelled(const kvq::AllocFile& a) {
  const int L = a.calib.n_layers;
  std::vector<int> kb(size_t(L), -1), vb(size_t(L), -1);
  for (const auto& h : a.heads) {
    EXPECT_EQ(h.kind, kvq::CodingKind::kVllmTurboQuant);
    auto& b = (h.side == kvq::Side::kK ? kb : vb)[size_t(h.layer)];
    if (b >= 0) {
      EXPECT_EQ(b, h.bits) << "layer " << h.layer;
    }
    b = h.bits;
  }
  Spelled s;
  std::set<std::pair<int, int>> coded;
  for (int l = 0; l < L; ++l) {
    if (kb[size_t(l)] == 16) {
      EXPECT_EQ(vb[size_t(l)], 16);
      s.kept.push_back(l);
    } else {
      coded.insert({kb[size_t(l)], vb[size_t(l)]});
    }
  }
  EXPECT_LE(coded.size(), 1u);
  if (!coded.empty()) {
    const auto [k, v] = *coded.begin();
    s.preset = k == 8 ? "turboquant_k8v4" : k == 4 ? "turboquant_4bit_nc" : v == 4 ? "turboquant_k3v4_nc" : "turboquant_3bit_nc";
    EXPECT_TRUE((k == 8 && v == 4) || (k == 4 && v == 4) || (k == 3 && (v == 3 || v == 4))) << k << "/" << v;
  }
  return s;
}


}  // namespace

TEST(VllmTurboQuantCli, AllocatesExportsAndVerifies) {
  const std::string cal = qwen3_cal();
  const std::string a12 = temp_path("vllm_tq_a12.kvqalloc.h5");
  auto r = run_cmd(bin("kvq-allocate") + " -q --calib " + cal + " --method vllm-turboquant --bpd 12 --out " + a12);
  ASSERT_EQ(r.status, 0) << r.err;
  const kvq::AllocFile a = kvq::read_alloc(a12);
  EXPECT_EQ(a.method, "vllm-turboquant");
  EXPECT_EQ(a.heads.size(), size_t(8 * 2 * 2));
  const Spelled s = spelled(a);
  for (int l : {0, 1, 6, 7}) EXPECT_TRUE(std::count(s.kept.begin(), s.kept.end(), l)) << "forced layer " << l;
  EXPECT_LT(s.kept.size(), 8u);  // 12 bits per dim leaves layers coded
  EXPECT_LE(a.k_bpd_effective, 12.0 + 1e-9);
  const json p = a.summary["joint"]["params"];
  EXPECT_EQ(p["preset"].get<std::string>(), s.preset);
  EXPECT_LE(std::stod(p["error"].get<std::string>()), std::stod(p["default_error"].get<std::string>()));

  // The serve flags: the decisions' preset and every kept layer, in the engine's syntax.
  std::string want = "--kv-cache-dtype " + s.preset + " --kv-cache-dtype-skip-layers";
  for (int l : s.kept) want += " " + std::to_string(l);
  const std::string out = temp_path("vllm_tq_export");
  fs::remove_all(out);
  const std::string printed = temp_path("vllm_tq_export.stdout");
  r = run_cmd(bin("kvq-export") + " -q vllm-turboquant --alloc " + a12 + " --out " + out + " > " + printed);
  ASSERT_EQ(r.status, 0) << r.err;
  {
    std::ifstream po(printed);
    std::string first;
    std::getline(po, first);
    EXPECT_EQ(first, want);
  }
  std::ifstream args(out + "/vllm_serve_args.txt");
  std::string line;
  std::getline(args, line);
  EXPECT_EQ(line, want);
  const json j = json::parse(std::ifstream(out + "/vllm_turboquant.json"));
  EXPECT_EQ(j["kv_cache_dtype"], s.preset);
  ASSERT_EQ(j["kv_cache_dtype_skip_layers"].size(), s.kept.size());
  for (size_t i = 0; i < s.kept.size(); ++i) EXPECT_EQ(j["kv_cache_dtype_skip_layers"][i], std::to_string(s.kept[i]));

  // kvq-inspect names the preset and the kept layers; --json carries the key codebook vLLM decodes
  // with (compared with the codec's own solve, bit for bit).
  const std::string ij = temp_path("vllm_tq_inspect.json"), it = temp_path("vllm_tq_inspect.txt");
  r = run_cmd(bin("kvq-inspect") + " " + a12 + " --json " + ij + " > " + it);
  ASSERT_EQ(r.status, 0) << r.err;
  {
    std::stringstream text;
    text << std::ifstream(it).rdbuf();
    std::string kept_list;
    for (int l : s.kept) kept_list += (kept_list.empty() ? "" : " ") + std::to_string(l);
    EXPECT_NE(text.str().find("--kv-cache-dtype " + s.preset + "; kept in BF16: " + kept_list), std::string::npos)
        << text.str();
  }
  const json ins = json::parse(std::ifstream(ij))["summary"]["vllm_turboquant"];
  EXPECT_EQ(ins["preset"], s.preset);
  const int key_bits = s.preset == "turboquant_k8v4" ? 8 : s.preset == "turboquant_4bit_nc" ? 4 : 3;
  if (key_bits != 8) {
    const auto cb = kvq::vllm_tq::lloyd_max(32, key_bits);
    ASSERT_EQ(ins["key_codebook"]["centroids"].size(), cb.centroids.size());
    for (size_t i = 0; i < cb.centroids.size(); ++i) EXPECT_EQ(ins["key_codebook"]["centroids"][i].get<float>(), cb.centroids[i]);
  } else {
    EXPECT_FALSE(ins.contains("key_codebook"));
  }
  const std::string a3i = temp_path("vllm_tq_3bit_inspect.json");

  // kvq-verify codes it: the 3-bit preset with only the forced layers kept against every layer kept.
  auto verify_mae = [&](const std::string& alloc) {
    const std::string js = alloc + ".verify.json";
    auto v = run_cmd(bin("kvq-verify") + " -q --calib " + cal + " --alloc " + alloc +
                     " --baseline-k-bpd 4 --baseline-v-bpd 4 --json " + js);
    EXPECT_EQ(v.status, 0) << v.err;
    return json::parse(std::ifstream(js))["allocation"]["overall"]["logit_mae"].get<double>();
  };
  const std::string a3 = temp_path("vllm_tq_3bit.kvqalloc.h5"), a16 = temp_path("vllm_tq_16.kvqalloc.h5");
  r = run_cmd(bin("kvq-allocate") + " -q --calib " + cal +
              " --method vllm-turboquant --presets turboquant_3bit_nc --max-error 1e30 --out " + a3);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(spelled(kvq::read_alloc(a3)).kept, (std::vector<int>{0, 1, 6, 7}));  // the fewest bytes: vLLM's default
  r = run_cmd(bin("kvq-inspect") + " -q " + a3 + " --json " + a3i + " > /dev/null");
  ASSERT_EQ(r.status, 0) << r.err;
  {
    const json k = json::parse(std::ifstream(a3i))["summary"]["vllm_turboquant"]["key_codebook"];
    const auto cb = kvq::vllm_tq::lloyd_max(32, 3);
    ASSERT_EQ(k["centroids"].size(), 8u);
    for (size_t i = 0; i < 8; ++i) EXPECT_EQ(k["centroids"][i].get<float>(), cb.centroids[i]);
  }
  r = run_cmd(bin("kvq-allocate") + " -q --calib " + cal + " --method vllm-turboquant --bpd 16 --out " + a16);
  ASSERT_EQ(r.status, 0) << r.err;
  const double m3 = verify_mae(a3), m16 = verify_mae(a16), m12 = verify_mae(a12);
  std::printf("logit MAE: 3bit_nc + forced %.6f, choice @12 bpd (%s, kept %zu) %.6f, all kept (BF16) %.6f\n", m3,
              s.preset.c_str(), s.kept.size(), m12, m16);
  EXPECT_GT(m3, 0.0);
  EXPECT_LT(m16, m3 / 10);
  EXPECT_LT(m12, m3);
}

// Sliding-window layers are kept whatever the budget (vLLM serves them only in the model dtype):
// a model whose every layer has a window has nothing to code.
TEST(VllmTurboQuantCli, WindowedLayersAreKept) {
  const std::string cal = capture("swa", "mistral-swa", "--layers 8");
  const std::string a = temp_path("vllm_tq_swa.kvqalloc.h5");
  auto r = run_cmd(bin("kvq-allocate") + " -q --calib " + cal + " --method vllm-turboquant --bpd 16 --out " + a);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(spelled(kvq::read_alloc(a)).kept, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  fs::remove(a);
  r = run_cmd(bin("kvq-allocate") + " -q --calib " + cal + " --method vllm-turboquant --bpd 12 --out " + a);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("below the cheapest vllm-turboquant choice"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(a));
}

TEST(VllmTurboQuantCli, RefusesWhatTheEngineRefuses) {
  const std::string cal = qwen3_cal();
  const std::string a = temp_path("vllm_tq_refused.kvqalloc.h5");
  auto refused = [&](const std::string& cmd, const std::string& want) {
    fs::remove(a);
    auto r = run_cmd(cmd + " --out " + a);
    EXPECT_NE(r.status, 0) << cmd;
    EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(a));
  };
  const std::string alloc = bin("kvq-allocate") + " -q --method vllm-turboquant --calib ";
  refused(alloc + cal + " --bpd 8", "below the cheapest vllm-turboquant choice");  // 4 forced of 8 layers: >= 9.1
  refused(alloc + cal + " --max-error 0", "the smallest reachable is");
  refused(alloc + cal + " --presets turboquant_2bit --bpd 12", "unknown preset 'turboquant_2bit'");
  refused(alloc + cal + " --v-method uniform --bpd 12", "give it as both --method and --v-method");
  refused(alloc + capture("qwen3_d24", "qwen3", "--layers 8 --head-dim 24 --kv-heads 2") + " --bpd 12",
          "not a power of two");
  refused(alloc + capture("mla", "deepseek_v2", "") + " --bpd 12", "MLA");
  // kvq-export refuses an allocation of another method.
  const std::string u = temp_path("vllm_tq_uniform.kvqalloc.h5");
  auto r = run_cmd(bin("kvq-allocate") + " -q --calib " + cal + " --method uniform --bpd 3 --out " + u);
  ASSERT_EQ(r.status, 0) << r.err;
  r = run_cmd(bin("kvq-export") + " -q vllm-turboquant --alloc " + u);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("needs a vllm-turboquant allocation"), std::string::npos) << r.err;
}

// The end-to-end probe as users run it: kvq-probe writes a schema-valid file whose kept (BF16)
// layers cost far less KL than vLLM's 3-bit preset; kvq-allocate --probe chooses by those figures:
// the error it records is the sum of the file's per-layer KL of what it chose (recomputed here from
// the JSON), --max-kl with vLLM's default figure gives at most the default's bytes; and the misuses
// are one line each.
TEST(VllmTurboQuantCli, ProbeFileDrivesTheChoice) {
  const std::string cal = qwen3_cal();
  const std::string dir = fs::path(cal).parent_path().string();
  const std::string probe = temp_path("vllm_tq.kvqprobe.json");
  fs::remove(probe);
  auto r = run_cmd(bin("kvq-probe") + " -q --model " + dir + "/m --calib " + cal + " --windows 3 --out " + probe);
  ASSERT_EQ(r.status, 0) << r.err;
  if (run_cmd("python3 -c 'import jsonschema'").status == 0) {
    r = run_cmd("python3 -c 'import json,sys,jsonschema; jsonschema.validate(json.load(open(sys.argv[1])), "
                "json.load(open(sys.argv[2])))' " + probe + " " + std::string(KVQ_SOURCE_DIR) + "/schemas/probe.schema.json");
    EXPECT_EQ(r.status, 0) << r.err;
  }
  const json p = json::parse(std::ifstream(probe));
  EXPECT_EQ(p["windows"], 3);
  EXPECT_EQ(p["positions"], 3 * 63);
  std::map<std::string, std::vector<double>> kl;
  for (const auto& s : p["settings"]) kl[s["name"].get<std::string>()] = s["kl"].get<std::vector<double>>();
  ASSERT_EQ(kl.size(), 5u);
  for (int l = 0; l < 8; ++l) EXPECT_LT(kl["kept"][size_t(l)], kl["turboquant_3bit_nc"][size_t(l)] / 10) << l;

  // kvq-inspect reads it: the per-layer table, a figure, the same JSON back.
  {
    const std::string figs = temp_path("vllm_tq_probe_figs"), txt = temp_path("vllm_tq_probe.txt"),
                      back = temp_path("vllm_tq_probe_back.json");
    fs::remove_all(figs);
    r = run_cmd(bin("kvq-inspect") + " " + probe + " --plots " + figs + " --json " + back + " > " + txt);
    ASSERT_EQ(r.status, 0) << r.err;
    std::stringstream t;
    t << std::ifstream(txt).rdbuf();
    EXPECT_NE(t.str().find("mean next-token KL (nats) with only that layer's K and V coded"), std::string::npos) << t.str();
    EXPECT_NE(t.str().find("turboquant_3bit_nc"), std::string::npos) << t.str();
    const std::string name = fs::path(probe).filename().string();
    const std::string stem = figs + "/" + name.substr(0, name.size() - std::string(".kvqprobe.json").size()) + ".probe";
    std::ifstream png(stem + ".png", std::ios::binary);
    char sig[8] = {};
    png.read(sig, 8);
    EXPECT_EQ(std::string(sig, 8), std::string("\x89PNG\r\n\x1a\n", 8));
    EXPECT_TRUE(fs::exists(stem + ".svg"));
    EXPECT_EQ(json::parse(std::ifstream(back))["settings"], p["settings"]);
  }
  const std::string a = temp_path("vllm_tq_probe.kvqalloc.h5");
  r = run_cmd(bin("kvq-allocate") + " -q --calib " + cal + " --method vllm-turboquant --probe " + probe + " --bpd 12 --out " + a);
  ASSERT_EQ(r.status, 0) << r.err;
  const kvq::AllocFile af = kvq::read_alloc(a);
  EXPECT_EQ(af.params["objective"], "kl");
  const Spelled s = spelled(af);
  double sum = 0;
  for (int l = 0; l < 8; ++l)
    sum += std::count(s.kept.begin(), s.kept.end(), l) ? kl["kept"][size_t(l)] : kl[s.preset][size_t(l)];
  const json params = af.summary["joint"]["params"];
  EXPECT_NEAR(std::stod(params["error"].get<std::string>()), sum, 1e-12 * sum);
  // --max-kl at vLLM's default figure for the chosen preset: no more bytes than that default.
  const std::string b = temp_path("vllm_tq_probe_maxkl.kvqalloc.h5");
  r = run_cmd(bin("kvq-allocate") + " -q --calib " + cal + " --method vllm-turboquant --probe " + probe + " --max-kl " +
              params["default_error"].get<std::string>() + " --out " + b);
  ASSERT_EQ(r.status, 0) << r.err;
  const json pb = kvq::read_alloc(b).summary["joint"];
  EXPECT_LE(std::stod(pb["params"]["error"].get<std::string>()), std::stod(params["default_error"].get<std::string>()));
  EXPECT_LE(std::stod(pb["params"]["default_bpd"].get<std::string>()), 16.0);

  auto refused = [&](const std::string& args, const std::string& want) {
    const std::string o = temp_path("vllm_tq_probe_refused.kvqalloc.h5");
    fs::remove(o);
    auto x = run_cmd(bin("kvq-allocate") + " -q --calib " + cal + " --method vllm-turboquant " + args + " --out " + o);
    EXPECT_NE(x.status, 0) << args;
    EXPECT_NE(x.err.find(want), std::string::npos) << x.err;
    EXPECT_EQ(std::count(x.err.begin(), x.err.end(), '\n'), 1) << x.err;
    EXPECT_FALSE(fs::exists(o));
  };
  refused("--max-kl 0.1", "--max-kl: needs --probe");
  refused("--probe " + probe + " --max-error 0.1", "give the bound as --max-kl");
  const std::string bad = temp_path("vllm_tq_bad.kvqprobe.json");
  {
    json j = p;
    j["settings"][1]["kl"][2] = -1.0;
    std::ofstream(bad) << j.dump();
  }
  refused("--probe " + bad + " --bpd 12", "settings[1].kl[2]: not a finite number >= 0");
  // A probe of another calibration (the mistral-swa one) is refused by its content digest.
  const std::string other_cal = capture("swa", "mistral-swa", "--layers 8");
  const std::string other = temp_path("vllm_tq_other.kvqprobe.json");
  fs::remove(other);
  r = run_cmd(bin("kvq-probe") + " -q --model " + fs::path(other_cal).parent_path().string() + "/m --calib " + other_cal +
              " --windows 1 --out " + other);
  ASSERT_EQ(r.status, 0) << r.err;
  refused("--probe " + other + " --bpd 12", "measured on another calibration");
  // --candidates allocation: the allocation's own coding per layer and every layer at once; the file
  // says how additive the layers' errors are, and is not a vllm-turboquant probe.
  const std::string pa = temp_path("vllm_tq_alloc.kvqprobe.json");
  fs::remove(pa);
  r = run_cmd(bin("kvq-probe") + " -q --model " + dir + "/m --calib " + cal + " --candidates allocation --alloc " + a +
              " --windows 3 --precision fp32 --out " + pa);
  ASSERT_EQ(r.status, 0) << r.err;
  {
    const json j = json::parse(std::ifstream(pa));
    ASSERT_EQ(j["settings"].size(), 1u);
    double layers = 0;
    for (double v : j["settings"][0]["kl"].get<std::vector<double>>()) layers += v;
    EXPECT_NEAR(j["composite"]["sum_of_layers_kl"].get<double>(), layers, 1e-12 * layers);
    EXPECT_NEAR(j["composite"]["additivity_ratio"].get<double>(), j["composite"]["kl"].get<double>() / layers, 1e-9);
    EXPECT_GT(j["composite"]["kl"].get<double>(), 0.0);
    EXPECT_FALSE(j.contains("forward_precision"));  // fp32: the field is not written
    // --precision bf16: recorded in the file; the allocation's composite KL measured by BF16
    // forwards is of the fp32 forwards' size (this allocation is nearly lossless, KL ~1e-5, so the
    // two forwards' own roundings move it by ~15 %; within a factor 1.5 either way).
    const std::string pb = temp_path("vllm_tq_alloc_bf16.kvqprobe.json");
    fs::remove(pb);
    r = run_cmd(bin("kvq-probe") + " -q --model " + dir + "/m --calib " + cal + " --candidates allocation --alloc " + a +
                " --windows 3 --precision bf16 --out " + pb);
    ASSERT_EQ(r.status, 0) << r.err;
    const json b = json::parse(std::ifstream(pb));
    EXPECT_EQ(b["forward_precision"], "bf16");
    const double k32 = j["composite"]["kl"].get<double>(), k16 = b["composite"]["kl"].get<double>();
    std::printf("allocation composite KL: fp32 forwards %.6g, bf16 forwards %.6g\n", k32, k16);
    EXPECT_NE(k16, k32);
    EXPECT_LT(k16, 1.5 * k32);
    EXPECT_GT(k16, k32 / 1.5);
  }
  refused("--probe " + pa + " --bpd 12", "not a probe of vllm-turboquant's candidates");
  r = run_cmd(bin("kvq-probe") + " -q --model " + dir + "/m --calib " + cal + " --candidates allocation --out " +
              temp_path("y.kvqprobe.json"));
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--candidates allocation needs --alloc"), std::string::npos) << r.err;
  // The windows come from the corpus the calibration records: moved away, one line saying so.
  fs::rename(dir + "/c.txt", dir + "/c.txt.away");
  r = run_cmd(bin("kvq-probe") + " -q --model " + dir + "/m --calib " + cal + " --out " + temp_path("z.kvqprobe.json"));
  fs::rename(dir + "/c.txt.away", dir + "/c.txt");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("cannot re-read the calibration windows: calibration corpus file"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(run kvq-probe where calib-capture ran)"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  // kvq-probe refuses a calibration of another model, naming the calibration file.
  r = run_cmd(bin("kvq-probe") + " -q --model " + dir + "/m --calib " + other_cal + " --out " + temp_path("x.kvqprobe.json"));
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("made from another model"), std::string::npos) << r.err;
}
