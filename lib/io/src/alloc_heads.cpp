#include "alloc_heads.hpp"

#include <cmath>

#include "kvq/format/coding_kinds.hpp"
#include "kvq/format/decision_layout.hpp"
#include "kvq/io/alloc_versions.hpp"
#include "kvq/io/h5.hpp"

namespace kvq::alloc_heads {

namespace {

std::vector<int> int_array(const std::string& file, const json& j, const char* key) {
  std::vector<int> out;
  for (const json& e : j.at(key)) {
    if (!e.is_number_integer() || e.get<int64_t>() < std::numeric_limits<int>::min() ||
        e.get<int64_t>() > std::numeric_limits<int>::max())
      throw Error(file, key, "not an integer in range: " + e.dump());
    out.push_back(static_cast<int>(e.get<int64_t>()));
  }
  return out;
}

const char* rotation_name(TqRotation r) { return r == TqRotation::kIdentity ? "identity" : "haar"; }

MinifloatFormat minifloat_from(const std::string& file, const std::string& where, const std::string& s) {
  if (s == to_string(MinifloatFormat::kFp8E4M3)) return MinifloatFormat::kFp8E4M3;
  if (s == to_string(MinifloatFormat::kNvfp4)) return MinifloatFormat::kNvfp4;
  throw Error(file, where + ".format", "unknown minifloat format '" + s + "' (valid: fp8, nvfp4)");
}

[[noreturn]] void needs_version(const HeadReadContext& c, const std::string& field, int64_t v) {
  throw Error(c.path, field,
              "needs allocation version >= " + std::to_string(v) + ", the file is version " + std::to_string(c.version));
}

void read_groups(const json& j, const std::string& where, const HeadReadContext& c, HeadDecision& h) {
  const std::string& path = c.path;
  std::vector<int> seen(size_t(c.head_dim), 0);
  for (const auto& g : j.at("groups")) {
    TqGroup tg;
    tg.bits = int_field<int>(path, g, "bits");
    tg.dims = int_array(path, g, "dims");
    tg.rotation_seed = int_field<uint64_t>(path, g, "rotation_seed");
    if (g.contains("rotation")) {  // version 2; absent = haar (version 1, and earlier version 2 files)
      const std::string r = g["rotation"].is_string() ? g["rotation"].get<std::string>() : g["rotation"].dump();
      if (c.version < kAllocGroupRotationVersion) needs_version(c, where + ".groups[].rotation", kAllocGroupRotationVersion);
      if (r == "identity") tg.rotation = TqRotation::kIdentity;
      else if (r != "haar") throw Error(path, where + ".groups[].rotation", "unknown rotation '" + r + "' (valid: haar, identity)");
    }
    if (g.contains("codebook")) {  // version 3; absent = gaussian
      const std::string cbk = g["codebook"].is_string() ? g["codebook"].get<std::string>() : g["codebook"].dump();
      if (c.version < kAllocGroupCodebookVersion) needs_version(c, where + ".groups[].codebook", kAllocGroupCodebookVersion);
      if (cbk == "exact") tg.codebook = TqCodebook::kSphere;
      else if (cbk != "gaussian")
        throw Error(path, where + ".groups[].codebook", "unknown codebook '" + cbk + "' (valid: gaussian, exact)");
      if (tg.codebook == TqCodebook::kSphere && (tg.dims.size() < 2 || tg.dims.size() > size_t(kTqSphereMaxM)))
        throw Error(path, where + ".groups[].codebook",
                    "exact needs 2.." + std::to_string(kTqSphereMaxM) + " dims, the group has " +
                        std::to_string(tg.dims.size()));
    }
    if (tg.bits < 1 || tg.bits > 8) throw Error(path, where + ".groups[].bits", "out of 1..8: " + std::to_string(tg.bits));
    for (int x : tg.dims) {
      if (x < 0 || x >= c.head_dim || seen[size_t(x)]++)
        throw Error(path, where + ".groups[].dims", "dim " + std::to_string(x) + " out of range or repeated");
    }
    h.groups.push_back(std::move(tg));
  }
}

void read_norm_correction(const json& j, const std::string& where, const HeadReadContext& c, HeadDecision& h) {
  h.norm_correction = c.norm_correction;
  if (!j.contains("norm_correction")) return;
  // Version 3: per head, overrides the manifest's.
  if (c.version < kAllocHeadNormCorrectionVersion) needs_version(c, where + ".norm_correction", kAllocHeadNormCorrectionVersion);
  if (!j["norm_correction"].is_boolean())
    throw Error(c.path, where + ".norm_correction", "must be true or false, found " + j["norm_correction"].dump());
  h.norm_correction = j["norm_correction"].get<bool>();
}

void read_group_norms(const json& j, const std::string& where, const HeadReadContext& c, HeadDecision& h) {
  if (!j.contains("group_norms")) return;  // version 4: compact group norms
  const std::string& path = c.path;
  const std::string gw = where + ".group_norms";
  if (c.version < kAllocCompactNormsVersion) needs_version(c, gw, kAllocCompactNormsVersion);
  const json& gn = j["group_norms"];
  if (!gn.is_object() || gn.value("kind", json()) != json("compact"))
    throw Error(path, gw + ".kind", "must be \"compact\", found " + (gn.is_object() ? gn.value("kind", json()).dump() : gn.dump()));
  h.ratio_bits = int_field<int>(path, gn, "ratio_bits");
  if (h.ratio_bits < 1 || h.ratio_bits > 8) throw Error(path, gw + ".ratio_bits", "out of 1..8: " + std::to_string(h.ratio_bits));
  if (h.groups.size() < 2)
    throw Error(path, gw, "compact group norms need >= 2 groups, the head has " + std::to_string(h.groups.size()));
  for (const char* key : {"norm_log2_lo", "norm_log2_step"}) {
    const json& v = gn.at(key);
    if (!v.is_number() || !std::isfinite(v.get<double>()) || std::fabs(v.get<double>()) > 1e4)
      throw Error(path, gw + "." + key, "must be a finite number, found " + v.dump());
  }
  h.norm_log2_lo = gn["norm_log2_lo"].get<float>();
  h.norm_log2_step = gn["norm_log2_step"].get<float>();
  h.ratio_codebook = h5::read_f32(path, c.tensors, gn.at("ratios").get<std::string>(),
                                  {hsize_t(1) << h.ratio_bits, hsize_t(h.groups.size())});
  try {
    layout::layout_for(h, c.head_dim);  // levels' range, codebook values: the codec's own checks
  } catch (const Error& e) {
    throw Error(path, gw, e.what());
  }
}

void read_minifloat_scale(const json& j, const std::string& where, const HeadReadContext& c, HeadDecision& h) {
  // JSON has no inf/NaN: nlohmann writes them as null, which reads back as a type error.
  const auto& sc = j.at("scale");
  if (!sc.is_number()) throw Error(c.path, where + ".scale", "must be a finite number > 0, found " + sc.dump());
  const double v = sc.get<double>();
  if (!(std::isfinite(v) && v > 0 && v <= 3.4028234663852886e38))
    throw Error(c.path, where + ".scale", "must be finite and > 0, found " + sc.dump());
  h.scale = static_cast<float>(v);
  if (!(h.scale > 0.f)) throw Error(c.path, where + ".scale", "underflows to 0 as a float: " + sc.dump());
}

}  // namespace

std::string tensor_name(const HeadDecision& h, const char* what) {
  return std::string(h.side == Side::kK ? "k" : "v") + "_l" + std::to_string(h.layer) + "_h" +
         std::to_string(h.kv_head) + "_" + what;
}

json head_json(const HeadDecision& h, int64_t version, bool per_head_norm_correction) {
  const uint32_t f = coding_kind(h.kind).fields;
  json j = {{"layer", h.layer},
            {"kv_head", h.kv_head},
            {"side", h.side == Side::kK ? "K" : "V"},
            {"kind", to_string(h.kind)},
            {"post_rope", h.post_rope}};
  if (f & kFieldGroups) {
    json gs = json::array();
    for (const auto& g : h.groups) {
      json jg = {{"bits", g.bits}, {"dims", g.dims}, {"rotation_seed", g.rotation_seed}};
      if (version >= kAllocGroupRotationVersion) jg["rotation"] = rotation_name(g.rotation);
      // Only when not the default: files without exact codebooks keep their bytes.
      if (g.codebook == TqCodebook::kSphere) jg["codebook"] = "exact";
      gs.push_back(std::move(jg));
    }
    j["groups"] = gs;
    if (per_head_norm_correction) j["norm_correction"] = h.norm_correction;
  }
  if ((f & kFieldBlockBits) && !h.block_bits.empty()) j["block_bits"] = h.block_bits;
  if ((f & kFieldGroupNorms) && h.ratio_bits > 0)
    j["group_norms"] = {{"kind", "compact"},
                        {"ratio_bits", h.ratio_bits},
                        {"norm_log2_lo", h.norm_log2_lo},
                        {"norm_log2_step", h.norm_log2_step},
                        {"ratios", tensor_name(h, "ratios")}};
  if (f & kFieldRank) j["rank"] = h.rank;
  if (f & kFieldBits) j["bits"] = h.bits;
  if (f & kFieldBudgetBits) j["budget_bits"] = h.budget_bits;
  if (f & kFieldHadamardSeed) j["hadamard_seed"] = h.hadamard_seed;
  if (f & (kFieldScale | kFieldScaleRecorded)) j["scale"] = h.scale;
  if (f & kFieldBasisMean) {
    j["basis"] = tensor_name(h, "basis");
    j["mean"] = tensor_name(h, "mean");
  }
  if (f & kFieldGroupSize) j["group_size"] = h.group_size;
  if (f & kFieldMinifloat) j["format"] = to_string(h.minifloat);
  j["predicted_distortion"] = h.predicted_distortion;
  return j;
}

void write_head_tensors(H5::Group& t, const HeadDecision& h, int d) {
  const uint32_t f = coding_kind(h.kind).fields;
  if ((f & kFieldGroupNorms) && h.ratio_bits > 0) {
    KVQ_ASSERT(h.ratio_codebook.size() == (size_t{1} << h.ratio_bits) * h.groups.size());
    h5::write(t, tensor_name(h, "ratios"), {hsize_t(1) << h.ratio_bits, hsize_t(h.groups.size())},
              h.ratio_codebook.data());
  }
  if (f & kFieldBasisMean) {
    KVQ_ASSERT(h.basis.size() == size_t(d) * size_t(h.rank) && h.mean.size() == size_t(d));
    h5::write(t, tensor_name(h, "basis"), {hsize_t(d), hsize_t(h.rank)}, h.basis.data());
    h5::write(t, tensor_name(h, "mean"), {hsize_t(d)}, h.mean.data());
  }
}

HeadDecision read_head(const json& j, const std::string& where, const HeadReadContext& c) {
  const std::string& path = c.path;
  const int d = c.head_dim;
  HeadDecision h;
  h.layer = int_field<int>(path, j, "layer");
  h.kv_head = int_field<int>(path, j, "kv_head");
  std::string side = j.at("side").get<std::string>();
  if (side != "K" && side != "V") throw Error(path, where + ".side", "must be K or V, found '" + side + "'");
  h.side = side == "K" ? Side::kK : Side::kV;
  const std::string kind_name = j.at("kind").get<std::string>();
  const CodingKindTraits* kind = find_coding_kind(kind_name);
  if (!kind) throw Error(path, "manifest.heads[].kind", "unknown coding kind '" + kind_name + "'");
  h.kind = kind->kind;
  h.post_rope = j.at("post_rope").get<bool>();
  h.predicted_distortion = j.value("predicted_distortion", 0.0);
  if (h.layer < 0 || h.layer >= c.n_layers || h.kv_head < 0 || h.kv_head >= c.n_kv_heads)
    throw Error(path, where, "layer/head out of range");
  if (c.version < kind->first_alloc_version)
    throw Error(path, where + ".kind", "'" + kind_name + "' needs allocation version >= " +
                                           std::to_string(kind->first_alloc_version) + ", the file is version " +
                                           std::to_string(c.version));
  const uint32_t f = kind->fields;
  if (f & kFieldGroups) read_groups(j, where, c, h);
  if ((f & kFieldBlockBits) && j.contains("block_bits")) h.block_bits = int_array(path, j, "block_bits");
  if (f & kFieldGroups) read_norm_correction(j, where, c, h);
  if (f & kFieldGroupNorms) read_group_norms(j, where, c, h);
  if (f & kFieldRank) {
    h.rank = int_field<int>(path, j, "rank");
    if (h.rank < 0 || h.rank > d) throw Error(path, where + ".rank", "out of 0.." + std::to_string(d) + ": " + std::to_string(h.rank));
  }
  if (f & kFieldBits) {
    h.bits = int_field<int>(path, j, "bits");
    if (h.bits < 0 || h.bits > 16) throw Error(path, where + ".bits", "out of range: " + std::to_string(h.bits));
  }
  if (f & kFieldBudgetBits) h.budget_bits = int_field<int>(path, j, "budget_bits");
  if (f & kFieldHadamardSeed) h.hadamard_seed = int_field<uint64_t>(path, j, "hadamard_seed");
  if (f & kFieldScaleRecorded) h.scale = j.at("scale").get<float>();
  if (f & kFieldMinifloat) h.minifloat = minifloat_from(path, where, j.at("format").get<std::string>());
  if (f & kFieldScale) read_minifloat_scale(j, where, c, h);
  if (f & kFieldGroupSize) h.group_size = int_field<int>(path, j, "group_size");
  if (f & kFieldBasisMean) {
    h.basis = h5::read_f32(path, c.tensors, j.at("basis").get<std::string>(), {hsize_t(d), hsize_t(h.rank)});
    h.mean = h5::read_f32(path, c.tensors, j.at("mean").get<std::string>(), {hsize_t(d)});
    for (float x : h.basis)
      if (!std::isfinite(x)) throw Error(path, where + ".basis", "non-finite value");
    for (float x : h.mean)
      if (!std::isfinite(x)) throw Error(path, where + ".mean", "non-finite value");
  }
  return h;
}

}  // namespace kvq::alloc_heads
