// kvq-export vllm/modelopt --model: the model directory an engine loads as it is. Checked by kvq's
// own HF reader (the forward of the exported directory equals the original's bit for bit), by an
// independent reader (python3 + numpy: the safetensors header is 8 bytes of length, JSON, offsets)
// for the index and the scale files, by the real JSON-schema validator, and the refusals: one line,
// exit 2, nothing written (no DIR, no hidden temporary beside it, a non-empty DIR untouched).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <tuple>

#include "kvq/export/modelopt.hpp"
#include "kvq/io/alloc_file.hpp"
#include "kvq/io/calib_file.hpp"
#include "kvq/model/model.hpp"
#include "kvq/util/atomic_file.hpp"
#include "run_cmd.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;
using kvq::test::bin;
using kvq::test::run_cmd;
using kvq::test::temp_path;

namespace {

const std::string kDemo = std::string(KVQ_SOURCE_DIR) + "/data/kvq-demo-llama";

kvq::test::CmdResult kvq_export(const std::string& args) { return run_cmd("timeout 120 " + bin("kvq-export") + " " + args); }

std::string fresh(const std::string& name) {
  const std::string d = temp_path(name);
  fs::remove_all(d);
  return d;
}

// The demo model's calibration (small) and a layer-precision allocation with per-side pairs.
struct Inputs {
  std::string cal, alloc;
};
const Inputs& inputs() {
  static Inputs in = [] {
    Inputs r;
    r.cal = temp_path("dir_demo.kvqcal.h5");
    auto c = run_cmd(bin("calib-capture") + " -q --threads 1 --model " + kDemo + " --corpus " + kDemo +
                     "/psalm23.txt --samples 2 --seq-len 32 --holdout 1 --reservoir-tokens 32 --out " + r.cal);
    EXPECT_EQ(c.status, 0) << c.err;
    r.alloc = temp_path("dir_demo.kvqalloc.h5");
    c = run_cmd(bin("kvq-allocate") + " -q --calib " + r.cal +
                " --method layer-precision --bpd 6.25 --formats fp8,nvfp4,fp8_k_nvfp4_v --out " + r.alloc);
    EXPECT_EQ(c.status, 0) << c.err;
    return r;
  }();
  return in;
}

// python3 with numpy ("" if there is none): the pyenv shim first, then Debian's.
std::string numpy_python() {
  for (const char* p : {"python3", "/usr/bin/python3"})
    if (run_cmd(std::string(p) + " -c 'import numpy' 2>/dev/null").status == 0) return p;
  return "";
}

// The independent reader: every *.safetensors file of `dir` and the index, as JSON
// {"index": weight_map, "total_size": N, "files": {file: {tensor: {dtype, shape, bytes, values?}}}}.
const char* kReader = R"PY(
import json, os, struct, sys
import numpy as np
d = sys.argv[1]
idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
files = sorted(set(idx["weight_map"].values()) | {f for f in os.listdir(d) if f.endswith(".safetensors")})
out = {"index": idx["weight_map"], "total_size": idx["metadata"]["total_size"], "files": {}}
for f in files:
    b = open(os.path.join(d, f), "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n].decode("utf-8"))
    base = 8 + n
    t = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        assert base + e <= len(b)
        ent = {"dtype": v["dtype"], "shape": v["shape"], "bytes": e - s}
        if v["dtype"] == "F32" and e - s <= 4096:
            ent["values"] = [float(x) for x in np.frombuffer(b[base + s:base + e], dtype="<f4")]
        t[k] = ent
    out["files"][f] = t
json.dump(out, sys.stdout)
)PY";

json read_independently(const std::string& dir) {
  const std::string py = numpy_python();
  if (py.empty()) return json();
  const std::string script = temp_path("st_reader.py");
  kvq::test::write_text(script, kReader);
  const std::string out = temp_path("st_reader.json");
  auto r = run_cmd(py + " " + script + " " + dir + " > " + out);
  EXPECT_EQ(r.status, 0) << r.err;
  return r.status == 0 ? json::parse(kvq::read_file(out)) : json();
}

// Every tensor of every safetensors file is in the index exactly once, under the file holding it,
// and total_size is their bytes: the problems found, one line each ("" when none).
std::string index_problems(const json& j) {
  std::string bad;
  std::map<std::string, std::string> holder;
  uint64_t bytes = 0;
  for (auto f = j["files"].begin(); f != j["files"].end(); ++f)
    for (auto t = f.value().begin(); t != f.value().end(); ++t) {
      if (!holder.emplace(t.key(), f.key()).second) bad += t.key() + " in two files\n";
      bytes += t.value()["bytes"].get<uint64_t>();
    }
  for (const auto& [name, file] : holder)
    if (!j["index"].contains(name)) bad += name + " (in " + file + ") not in the index\n";
    else if (j["index"][name] != file) bad += name + " indexed under " + j["index"][name].dump() + ", held by " + file + "\n";
  for (auto it = j["index"].begin(); it != j["index"].end(); ++it)
    if (!holder.count(it.key())) bad += it.key() + " indexed but in no file\n";
  if (j["total_size"].get<uint64_t>() != bytes) bad += "total_size " + j["total_size"].dump() + " != " + std::to_string(bytes) + "\n";
  return bad;
}
void expect_index_complete(const json& j) { EXPECT_EQ(index_problems(j), ""); }

int validate(const std::string& json_path, const std::string& schema) {
  auto r = run_cmd(
      "python3 -c 'import json,sys,jsonschema; s=json.load(open(sys.argv[2])); "
      "jsonschema.Draft202012Validator.check_schema(s); jsonschema.validate(json.load(open(sys.argv[1])), s, "
      "cls=jsonschema.Draft202012Validator)' " +
      json_path + " " + std::string(KVQ_SOURCE_DIR) + "/schemas/" + schema);
  EXPECT_EQ(r.status, 0) << json_path << " against " << schema << ": " << r.err;
  return r.status;
}
bool have_jsonschema() { return run_cmd("python3 -c 'import jsonschema'").status == 0; }

// The exported directory's forward equals the original's, bit for bit.
void expect_same_forward(const std::string& original, const std::string& exported) {
  const kvq::Model a = kvq::Model::load(original), b = kvq::Model::load(exported);
  const at::Tensor ids = (at::arange(0, 48, at::kLong) * 37 % 1000).view({1, 48});
  EXPECT_TRUE(at::equal(a.forward(ids), b.forward(ids)));
}

// A sharded copy of the demo model: its tensors split over two files by the test (name order), an
// index, the other files copied byte for byte (so config.json's sha256 is the calibration's).
std::string sharded_demo() {
  const std::string d = temp_path("demo_sharded");
  if (fs::exists(d / fs::path("model.safetensors.index.json"))) return d;
  fs::remove_all(d);
  fs::create_directories(d);
  for (const char* f : {"config.json", "tokenizer.model", "psalm23.txt"}) fs::copy_file(kDemo + "/" + f, d + "/" + f);
  const std::string script = temp_path("shard.py");
  kvq::test::write_text(script, R"PY(
import json, struct, sys
src, d = sys.argv[1], sys.argv[2]
b = open(src, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); base = 8 + n
names = sorted(k for k in h if k != "__metadata__")
parts = [names[:len(names) // 2], names[len(names) // 2:]]
wm = {}
for i, part in enumerate(parts):
    fn = "model-%05d-of-00002.safetensors" % (i + 1)
    hdr, blobs, off = {}, [], 0
    for k in part:
        s, e = h[k]["data_offsets"]
        hdr[k] = {"dtype": h[k]["dtype"], "shape": h[k]["shape"], "data_offsets": [off, off + e - s]}
        blobs.append(b[base + s:base + e]); off += e - s
        wm[k] = fn
    hj = json.dumps(hdr).encode(); hj += b" " * ((8 - len(hj) % 8) % 8)
    open(d + "/" + fn, "wb").write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))
json.dump({"metadata": {"total_size": sum(h[k]["data_offsets"][1] - h[k]["data_offsets"][0] for k in names)},
           "weight_map": wm}, open(d + "/model.safetensors.index.json", "w"), indent=2)
)PY");
  auto r = run_cmd("python3 " + script + " " + kDemo + "/model.safetensors " + d);
  EXPECT_EQ(r.status, 0) << r.err;
  return d;
}

float max_over_heads(const std::vector<float>& amax, int layer, int heads) {
  return *std::max_element(amax.begin() + layer * heads, amax.begin() + (layer + 1) * heads);
}

void expect_refused(const kvq::test::CmdResult& r, const std::vector<std::string>& parts) {
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  for (const auto& p : parts) EXPECT_NE(r.err.find(p), std::string::npos) << p << " in: " << r.err;
}

// Nothing of `out` exists and no hidden temporary is left beside it.
void expect_nothing_written(const std::string& out) {
  EXPECT_FALSE(fs::exists(out)) << out;
  for (const auto& e : fs::directory_iterator(fs::path(out).parent_path()))
    EXPECT_EQ(e.path().filename().string().find(".kvq-tmp."), std::string::npos) << e.path();
}

}  // namespace

TEST(ExportModelDir, VllmSingleFileCheckpoint) {
  const Inputs& in = inputs();
  const std::string out = fresh("vllm_dir");
  auto r = kvq_export("vllm -q --model " + kDemo + " --calib " + in.cal + " --out " + out);
  ASSERT_EQ(r.status, 0) << r.err;
  // The original files linked (to the originals), config.json and the index rewritten.
  for (const char* f : {"model.safetensors", "tokenizer.model", "psalm23.txt"}) {
    EXPECT_TRUE(fs::is_symlink(out + "/" + f)) << f;
    EXPECT_EQ(fs::canonical(out + "/" + f), fs::canonical(kDemo + "/" + f)) << f;
  }
  EXPECT_FALSE(fs::is_symlink(out + "/config.json"));
  // config.json: every original field untouched, quantization_config.kv_cache_scheme added.
  json orig = json::parse(kvq::read_file(kDemo + "/config.json")), got = json::parse(kvq::read_file(out + "/config.json"));
  ASSERT_TRUE(got.contains("quantization_config"));
  const json scheme = got["quantization_config"]["kv_cache_scheme"];
  EXPECT_EQ(scheme, (json{{"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}, {"dynamic", false}, {"symmetric", true}}));
  got.erase("quantization_config");
  EXPECT_EQ(got, orig);
  expect_same_forward(kDemo, out);

  const json j = read_independently(out);
  if (j.is_null()) GTEST_SKIP() << "needs python3 with numpy (python3-numpy) for the independent reader";
  expect_index_complete(j);
  // vLLM's names, F32 [1] each, amax / 448 with amax the max over the layer's heads (from the
  // calibration file as kvq reads it; the division here, in double, then one rounding).
  const kvq::CalibFile c = kvq::read_calib(in.cal, false);
  const int L = c.prov.n_layers;
  const json& st = j["files"]["kv_scales.safetensors"];
  EXPECT_EQ(st.size(), size_t(3 * L));
  for (int l = 0; l < L; ++l)
    for (const auto& [side, amax, heads] : {std::tuple{"k", &c.moments.k_amax, c.prov.n_kv_heads},
                                            std::tuple{"v", &c.moments.v_amax, c.prov.n_kv_heads},
                                            std::tuple{"q", &c.moments.q_amax, c.prov.n_heads}}) {
      const std::string name = "model.layers." + std::to_string(l) + ".self_attn." + side + "_scale";
      ASSERT_TRUE(st.contains(name)) << name;
      EXPECT_EQ(st[name]["dtype"], "F32");
      EXPECT_EQ(st[name]["shape"], json::array({1}));
      EXPECT_EQ(float(st[name]["values"][0].get<double>()), float(double(max_over_heads(*amax, l, heads)) / 448.0)) << name;
    }
  if (have_jsonschema()) {
    validate(out + "/model.safetensors.index.json", "safetensors-index.schema.json");
    const std::string s = temp_path("scheme_of_config.json");
    kvq::test::write_text(s, json{{"kv_cache_scheme", scheme}}.dump());
    validate(s, "vllm-kv-cache-scheme.schema.json");
  }
}

TEST(ExportModelDir, VllmShardedCheckpointAndCopy) {
  const Inputs& in = inputs();
  const std::string model = sharded_demo();
  for (const bool copy : {false, true}) {
    SCOPED_TRACE(copy ? "--copy" : "linked");
    const std::string out = fresh(copy ? "vllm_sharded_copy" : "vllm_sharded");
    auto r = kvq_export("vllm -q --model " + model + " --calib " + in.cal + " --strategy attn_head --out " + out +
                        (copy ? " --copy" : ""));
    ASSERT_EQ(r.status, 0) << r.err;
    for (const char* f : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "tokenizer.model"}) {
      EXPECT_EQ(fs::is_symlink(out + "/" + f), !copy) << f;
      EXPECT_EQ(kvq::read_file(out + "/" + f), kvq::read_file(model + "/" + f)) << f;
    }
    // kvq's reader follows the index here (no model.safetensors): the scale file's tensors are listed
    // and ignored, the weights load from the shards.
    expect_same_forward(kDemo, out);
    const json j = read_independently(out);
    if (j.is_null()) GTEST_SKIP() << "needs python3 with numpy (python3-numpy) for the independent reader";
    expect_index_complete(j);
    EXPECT_EQ(j["files"].size(), 3u);
    const kvq::CalibFile c = kvq::read_calib(in.cal, false);
    const json& k1 = j["files"]["kv_scales.safetensors"]["model.layers.1.self_attn.k_scale"];
    EXPECT_EQ(k1["shape"], json::array({c.prov.n_kv_heads}));
    for (int h = 0; h < c.prov.n_kv_heads; ++h)
      EXPECT_EQ(float(k1["values"][size_t(h)].get<double>()),
                float(double(c.moments.k_amax[size_t(c.prov.n_kv_heads + h)]) / 448.0));
    EXPECT_EQ(j["files"]["kv_scales.safetensors"]["model.layers.0.self_attn.q_scale"]["shape"],
              json::array({c.prov.n_heads}));
    if (have_jsonschema()) validate(out + "/model.safetensors.index.json", "safetensors-index.schema.json");
  }
}

TEST(ExportModelDir, ModelOptDirectory) {
  const Inputs& in = inputs();
  const std::string out = fresh("mo_dir");
  auto r = kvq_export("modelopt -q --model " + kDemo + " --alloc " + in.alloc + " --out " + out);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(out + "/config.json"));  // ModelOpt reads hf_quant_config.json
  expect_same_forward(kDemo, out);
  // hf_quant_config.json: the per-layer algorithm from the allocation's heads, named here.
  const kvq::AllocFile a = kvq::read_alloc(in.alloc);
  const int L = a.calib.n_layers;
  std::vector<std::string> k(static_cast<size_t>(L)), v(static_cast<size_t>(L));
  std::vector<double> k_amax(static_cast<size_t>(L), 0.0), v_amax(static_cast<size_t>(L), 0.0);
  for (const auto& h : a.heads) {
    const bool fp8 = h.minifloat == kvq::MinifloatFormat::kFp8E4M3;
    (h.side == kvq::Side::kK ? k : v)[size_t(h.layer)] = fp8 ? "FP8" : "NVFP4";
    // The head's scale is amax/448 (FP8) or amax/(448*6) (NVFP4).
    auto& m = (h.side == kvq::Side::kK ? k_amax : v_amax)[size_t(h.layer)];
    m = std::max(m, double(h.scale) * 448.0 * (fp8 ? 1.0 : 6.0));
  }
  std::set<std::string> algos;
  json layers = json::object();
  for (int l = 0; l < L; ++l) {
    const std::string algo = k[size_t(l)] == v[size_t(l)] ? k[size_t(l)] : k[size_t(l)] + "_K_" + v[size_t(l)] + "_V";
    algos.insert(algo);
    layers["model.layers." + std::to_string(l) + ".self_attn"] = {{"quant_algo", algo}};
  }
  const json q = json::parse(kvq::read_file(out + "/hf_quant_config.json"))["quantization"];
  EXPECT_EQ(q["kv_cache_quant_algo"], algos.size() == 1 ? *algos.begin() : std::string("MIXED_PRECISION"));
  EXPECT_EQ(q["kv_cache_quantized_layers"], layers);  // every layer, as ModelOpt's KV-only export writes
  EXPECT_EQ(q["quantized_layers"], json::object());
  EXPECT_TRUE(algos.count("FP8_K_NVFP4_V")) << "the allocation at 6.25 bits should use the per-side pair";
  if (have_jsonschema()) {
    validate(out + "/hf_quant_config.json", "modelopt-hf-quant-config.schema.json");
    validate(out + "/model.safetensors.index.json", "safetensors-index.schema.json");
  }
  const json j = read_independently(out);
  if (j.is_null()) GTEST_SKIP() << "needs python3 with numpy (python3-numpy) for the independent reader";
  expect_index_complete(j);
  const json& st = j["files"]["kv_scales.safetensors"];
  EXPECT_EQ(st.size(), size_t(2 * L));
  for (int l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    for (const auto& [name, amax] : {std::pair{p + "k_proj.k_scale", k_amax[size_t(l)]}, std::pair{p + "v_proj.v_scale", v_amax[size_t(l)]}}) {
      ASSERT_TRUE(st.contains(name)) << name;
      EXPECT_EQ(st[name]["dtype"], "F32");
      EXPECT_EQ(st[name]["shape"], json::array());
      EXPECT_NEAR(st[name]["values"][0].get<double>(), amax / 448.0, 1e-6 * amax / 448.0) << name;
    }
  }
}

TEST(ExportModelDir, RefusesAndWritesNothing) {
  const Inputs& in = inputs();
  const std::string out = fresh("refused_dir");
  // An existing, non-empty DIR: refused, its contents untouched.
  fs::create_directories(out);
  kvq::test::write_text(out + "/keep.txt", "mine");
  expect_refused(kvq_export("vllm --model " + kDemo + " --calib " + in.cal + " --out " + out), {out, "--out", "not empty"});
  expect_refused(kvq_export("modelopt --model " + kDemo + " --alloc " + in.alloc + " --out " + out), {"not empty"});
  EXPECT_EQ(std::distance(fs::directory_iterator(out), fs::directory_iterator()), 1);
  EXPECT_EQ(kvq::read_file(out + "/keep.txt"), "mine");
  fs::remove_all(out);

  // Another model: the same weights with a config.json that differs (its sha256 is not the one the
  // calibration and the allocation record).
  const std::string other = fresh("other_model");
  fs::create_directories(other);
  for (const char* f : {"model.safetensors", "tokenizer.model"}) fs::copy_file(kDemo + "/" + f, other + "/" + f);
  json cfg = json::parse(kvq::read_file(kDemo + "/config.json"));
  cfg["max_position_embeddings"] = 1024;
  kvq::test::write_text(other + "/config.json", cfg.dump(2));
  expect_refused(kvq_export("vllm --model " + other + " --calib " + in.cal + " --out " + out),
                 {in.cal, "provenance.model_config_sha256", "made from another model"});
  expect_nothing_written(out);
  expect_refused(kvq_export("modelopt --model " + other + " --alloc " + in.alloc + " --out " + out),
                 {in.alloc, "calibration.model_config_sha256", "made from another model"});
  expect_nothing_written(out);

  // A config with a different KV-cache scheme already.
  cfg = json::parse(kvq::read_file(kDemo + "/config.json"));
  cfg["quantization_config"] = {{"quant_method", "compressed-tensors"},
                                {"kv_cache_scheme", {{"num_bits", 8}, {"type", "int"}, {"strategy", "tensor"},
                                                     {"dynamic", false}, {"symmetric", true}}}};
  kvq::test::write_text(other + "/config.json", cfg.dump(2));
  expect_refused(kvq_export("vllm --model " + other + " --calib " + in.cal + " --out " + out),
                 {"config.json", "quantization_config.kv_cache_scheme", "different KV-cache scheme"});
  expect_nothing_written(out);
  expect_refused(kvq_export("modelopt --model " + other + " --alloc " + in.alloc + " --out " + out),
                 {"quantization_config.kv_cache_scheme", "already has a KV-cache scheme"});
  expect_nothing_written(out);

  // A combination ModelOpt lacks: NVFP4 keys with FP8 values (kvq-allocate never makes it; the file
  // is edited here).
  kvq::AllocFile a = kvq::read_alloc(in.alloc);
  for (auto& h : a.heads)
    if (h.layer == 0) {
      h.minifloat = h.side == kvq::Side::kK ? kvq::MinifloatFormat::kNvfp4 : kvq::MinifloatFormat::kFp8E4M3;
      h.scale = 0.01f;
    }
  const std::string bad = temp_path("nvfp4_k_fp8_v.kvqalloc.h5");
  kvq::write_alloc(bad, a);
  expect_refused(kvq_export("modelopt --model " + kDemo + " --alloc " + bad + " --out " + out),
                 {bad, "layer 0: K NVFP4 with V FP8", "ModelOpt lacks"});
  expect_nothing_written(out);

  // A model directory whose files cannot all be linked (a dangling link): the failure comes after
  // the temporary directory was made, and it is removed.
  const std::string broken = fresh("broken_model");
  fs::create_directories(broken);
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(kDemo + "/" + f, broken + "/" + f);
  fs::create_symlink(temp_path("nowhere"), broken + "/dangling.txt");
  expect_refused(kvq_export("vllm --model " + broken + " --calib " + in.cal + " --out " + out), {"dangling.txt"});
  expect_nothing_written(out);

  // A checkpoint kvq already exported into: the scale file (and, for modelopt, hf_quant_config.json)
  // would be written again. (A vllm export's config.json is rewritten, so a calibration no longer
  // matches it: that is refused as another model.)
  const std::string vllm_once = fresh("exported_once");
  ASSERT_EQ(kvq_export("vllm -q --model " + kDemo + " --calib " + in.cal + " --out " + vllm_once).status, 0);
  expect_refused(kvq_export("vllm --model " + vllm_once + " --calib " + in.cal + " --out " + out),
                 {"made from another model"});
  expect_nothing_written(out);
  const std::string mo_once = fresh("exported_once_mo");
  ASSERT_EQ(kvq_export("modelopt -q --model " + kDemo + " --alloc " + in.alloc + " --out " + mo_once).status, 0);
  expect_refused(kvq_export("vllm --model " + mo_once + " --calib " + in.cal + " --out " + out),
                 {"kv_scales.safetensors", "already has this file"});
  expect_nothing_written(out);
  expect_refused(kvq_export("modelopt --model " + mo_once + " --alloc " + in.alloc + " --out " + out),
                 {"already has this file"});
  expect_nothing_written(out);

  // A hidden sibling left by a run that was killed while building (its pid no longer exists: above
  // pid_max) is removed by the next run into the same DIR; one of a live process is left alone.
  {
    const std::string target = fresh("stale_target");
    const fs::path parent = fs::path(target).parent_path();
    const std::string name = fs::path(target).filename().string();
    const long pid_max = std::stol(kvq::read_file("/proc/sys/kernel/pid_max"));
    const fs::path dead = parent / ("." + name + ".kvq-tmp." + std::to_string(pid_max + 1));
    const fs::path live = parent / ("." + name + ".kvq-tmp.1");
    fs::create_directories(dead);
    fs::create_directories(live);
    kvq::test::write_text((dead / "config.json").string(), "{}");
    ASSERT_EQ(kvq_export("vllm -q --model " + kDemo + " --calib " + in.cal + " --out " + target).status, 0);
    EXPECT_FALSE(fs::exists(dead));
    EXPECT_TRUE(fs::exists(live));
    fs::remove_all(live);
  }

  // --copy without --model; a model that is not a directory.
  expect_refused(kvq_export("vllm --calib " + in.cal + " --copy --out " + out), {"--copy", "needs --model"});
  expect_refused(kvq_export("vllm --model " + in.cal + " --calib " + in.cal + " --out " + out), {"--model", "not a directory"});
  expect_nothing_written(out);
}

// The checker above catches what it is there for (negative controls on a real reader output).
TEST(ExportModelDir, IndexCheckerCatchesMissingAndDoubleEntries) {
  const Inputs& in = inputs();
  const std::string out = fresh("vllm_dir_control");
  ASSERT_EQ(kvq_export("vllm -q --model " + kDemo + " --calib " + in.cal + " --out " + out).status, 0);
  const json j = read_independently(out);
  if (j.is_null()) GTEST_SKIP() << "needs python3 with numpy (python3-numpy) for the independent reader";
  json bad = j;
  bad["index"].erase("model.layers.2.self_attn.v_scale");
  EXPECT_NE(index_problems(bad).find("model.layers.2.self_attn.v_scale (in kv_scales.safetensors) not in the index"),
            std::string::npos);
  bad = j;
  bad["files"]["model.safetensors"]["model.layers.0.self_attn.k_scale"] = {{"dtype", "F32"}, {"shape", {1}}, {"bytes", 4}};
  EXPECT_NE(index_problems(bad).find("model.layers.0.self_attn.k_scale in two files"), std::string::npos);
  EXPECT_NE(index_problems(bad).find("total_size"), std::string::npos);
  bad = j;
  bad["index"]["lm_head.weight"] = "kv_scales.safetensors";
  EXPECT_NE(index_problems(bad).find("lm_head.weight indexed under \"kv_scales.safetensors\", held by model.safetensors"),
            std::string::npos);
  EXPECT_EQ(index_problems(j), "");
}

// hf_quant_config.json for per-side pairs, written out here from ModelOpt's names.
TEST(ExportModelDir, ModelOptPerSideAlgorithms) {
  const auto F8 = kvq::MinifloatFormat::kFp8E4M3, F4 = kvq::MinifloatFormat::kNvfp4;
  auto alloc = [&](const std::vector<std::pair<kvq::MinifloatFormat, kvq::MinifloatFormat>>& layers) {
    kvq::AllocFile a;
    a.method = a.v_method = "layer-precision";
    a.calib.n_layers = int(layers.size());
    for (kvq::Side side : {kvq::Side::kK, kvq::Side::kV})
      for (int l = 0; l < int(layers.size()); ++l)
        for (int h = 0; h < 2; ++h) {
          kvq::HeadDecision d;
          d.layer = l;
          d.kv_head = h;
          d.side = side;
          d.kind = kvq::CodingKind::kMinifloat;
          d.minifloat = side == kvq::Side::kK ? layers[size_t(l)].first : layers[size_t(l)].second;
          d.scale = 0.25f * float(h + 1);
          a.heads.push_back(d);
        }
    return a;
  };
  const json mixed = kvq::exporter::modelopt_config_json(alloc({{F8, F8}, {F8, F4}, {F4, F4}}));
  EXPECT_EQ(mixed["quantization"],
            (json{{"quant_algo", nullptr},
                  {"quantized_layers", json::object()},
                  {"kv_cache_quant_algo", "MIXED_PRECISION"},
                  {"kv_cache_quantized_layers",
                   {{"model.layers.0.self_attn", {{"quant_algo", "FP8"}}},
                    {"model.layers.1.self_attn", {{"quant_algo", "FP8_K_NVFP4_V"}}},
                    {"model.layers.2.self_attn", {{"quant_algo", "NVFP4"}}}}},
                  {"kv_cache_schema_version", 1}}));
  const json uniform = kvq::exporter::modelopt_config_json(alloc({{F8, F4}, {F8, F4}}));
  EXPECT_EQ(uniform["quantization"],
            (json{{"quant_algo", nullptr},
                  {"quantized_layers", json::object()},
                  {"kv_cache_quant_algo", "FP8_K_NVFP4_V"},
                  {"kv_cache_quantized_layers",
                   {{"model.layers.0.self_attn", {{"quant_algo", "FP8_K_NVFP4_V"}}},
                    {"model.layers.1.self_attn", {{"quant_algo", "FP8_K_NVFP4_V"}}}}},
                  {"kv_cache_schema_version", 1}}));
  // Scales: the max over heads of amax / 448; FP8 heads' scale is amax/448, NVFP4's amax/(448*6).
  const auto t = kvq::exporter::modelopt_tensors(alloc({{F8, F4}}));
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].name, "model.layers.0.self_attn.k_proj.k_scale");
  EXPECT_TRUE(t[0].shape.empty());
  float k0, v0;
  std::memcpy(&k0, t[0].bytes.data(), 4);
  std::memcpy(&v0, t[1].bytes.data(), 4);
  EXPECT_EQ(k0, 0.5f);
  EXPECT_EQ(v0, 3.0f);
  if (!have_jsonschema()) GTEST_SKIP() << "needs python3-jsonschema";
  for (const json& doc : {mixed, uniform}) {
    const std::string path = temp_path("mo_doc.json");
    kvq::test::write_text(path, doc.dump());
    validate(path, "modelopt-hf-quant-config.schema.json");
  }
  json bad = mixed;
  bad["quantization"]["kv_cache_quantized_layers"]["model.layers.0.self_attn"]["quant_algo"] = "NVFP4_K_FP8_V";
  const std::string path = temp_path("mo_bad.json");
  kvq::test::write_text(path, bad.dump());
  EXPECT_NE(run_cmd("python3 -c 'import json,sys,jsonschema; jsonschema.validate(json.load(open(sys.argv[1])), "
                    "json.load(open(sys.argv[2])))' " + path + " " + std::string(KVQ_SOURCE_DIR) +
                    "/schemas/modelopt-hf-quant-config.schema.json").status,
            0);
}

TEST(ExportModelDir, HelpNamesModelAndCopy) {
  for (const char* sub : {"vllm", "modelopt"}) {
    const std::string out = temp_path(std::string("help_") + sub + ".txt");
    ASSERT_EQ(run_cmd("timeout 60 " + bin("kvq-export") + " " + sub + " --help > " + out).status, 0);
    const std::string help = kvq::read_file(out);
    for (const char* w : {"--model", "--copy", "--out"}) EXPECT_NE(help.find(w), std::string::npos) << sub << " " << w;
  }
}
