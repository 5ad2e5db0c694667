#pragma once
// The allocation file (.kvqalloc.h5): a JSON manifest (everything but large tensors) plus the
// per-head COBRA bases and means. Layout: schemas/allocation-file.md; manifest schema:
// schemas/allocation-manifest.schema.json.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "kvq/format/decision.hpp"
#include "kvq/io/alloc_versions.hpp"
#include "kvq/io/calib_file.hpp"

namespace kvq {

struct AllocFile {
  std::string method;            // K method name, e.g. "block-gtq"
  std::string v_method;          // V method name
  nlohmann::json params;         // every solver parameter, by name
  double k_bpd_nominal = 0, v_bpd_nominal = 0;
  double k_bpd_effective = 0, v_bpd_effective = 0;  // all stored bits per token / d (codes+norms+scales)
  std::string calib_path, calib_sha256, calib_digest;
  CalibProvenance calib;         // provenance of the calibration input (model, convention, corpus)
  std::vector<HeadDecision> heads;  // every (layer, KV head, side), sorted by (side, layer, head)
  nlohmann::json summary;        // solver figures (objective, per-head distortion spread, ...)
  // Per-head distortion the COBRA solver predicted at the even split ("before C2"), layer-major
  // [n_layers * n_kv_heads], one vector per side. Empty: the side is not COBRA-allocated, or the
  // file was written before kvq stored them (optional datasets /solver/<s>_distortion_before).
  std::vector<double> k_distortion_before, v_distortion_before;

  const std::vector<double>& distortion_before(Side s) const {
    return s == Side::kK ? k_distortion_before : v_distortion_before;
  }

  const HeadDecision& head(Side s, int layer, int kv_head) const;
};

nlohmann::json alloc_manifest(const AllocFile& a);  // what the JSON schema validates
int64_t alloc_version_for(const AllocFile& a);      // the version write_alloc writes (see above)
void write_alloc(const std::string& path, const AllocFile& a);  // atomic
AllocFile read_alloc(const std::string& path);

// Refuses an allocation made for another model/convention than the calibration file (field named).
void check_alloc_matches(const AllocFile& a, const std::string& alloc_path, const CalibFile& c,
                         const std::string& calib_path);

}  // namespace kvq
