#pragma once
// The calibration file's (.kvqcal.h5) format name and versions: frozen numbers, read by its
// reader/writer (calib_file.hpp) and by the check every kvq file passes (kvq_file.hpp).
#include <cstddef>
#include <cstdint>

namespace kvq {

inline constexpr const char* kCalibFormat = "kvq-calibration";
// Written to disk; bump on any layout change. 2: provenance records the model's RoPE (rope_type,
// rope_inv_freq, rope_attention_factor); version-1 files read as unscaled theta^(-2i/d_r) RoPE.
// 3: /stats/amax_{k,v,q}, the activation maxima (Moments::k_amax ...); older files read without them.
// 4: the provenance in the root dataset /provenance (u8, its JSON's UTF-8 bytes) instead of the
// root attribute, written only when it is too large for an HDF5 attribute (more than
// kCalibProvenanceAttrMax bytes: a corpus folder of several hundred files); other files are
// written at 3 and keep their bytes.
// 5: a value dim unlike the key's and a recorded softmax scale (MLA's served cache: K 576, V 512,
// scale 192^-1/2 mscale^2): provenance "head_dim_v" / "softmax_scale", /stats@head_dim_v, the V
// moments, reservoir and held-out V at that dim; the provenance in the /provenance dataset as in 4.
// Written only for such files; older files read with V at head_dim and scale 1/sqrt(head_dim).
// 6: attention sinks (gpt-oss): provenance "attention_sinks" [n_layers][n_heads], one logit per
// query head joining every softmax's denominator; the provenance in the /provenance dataset as in 4.
// Written only for such files; a file of version < 6 with the key is refused.
// 7: per-layer RoPE (Gemma 3's local layers): provenance "rope_local_inv_freq",
// "rope_local_attention_factor", "rope_local_layers"; written only for such files (in the dataset).
// 8: hybrid decoders (Qwen3.5: Gated DeltaNet layers without a KV cache): provenance
// "decoder_layers" (each KV layer's decoder index) and "n_decoder_layers"; the file's layers are the
// KV layers. Written only for such files (in the dataset).
inline constexpr int64_t kCalibVersion = 8;
inline constexpr int64_t kCalibOldestVersion = 1;
inline constexpr int64_t kCalibAttrProvenanceVersion = 3;     // what a file with the attribute is written at
inline constexpr int64_t kCalibProvenanceDatasetVersion = 4;
inline constexpr int64_t kCalibKvDimsVersion = 5;
inline constexpr int64_t kCalibSinksVersion = 6;
inline constexpr int64_t kCalibLocalRopeVersion = 7;
inline constexpr int64_t kCalibHybridVersion = 8;
inline constexpr size_t kCalibProvenanceAttrMax = 60000;       // HDF5's limit is 64 KiB per header message
inline constexpr size_t kCalibProvenanceMaxBytes = size_t(1) << 30;  // what a reader accepts

}  // namespace kvq
