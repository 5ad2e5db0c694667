#pragma once
// The allocation file's (.kvqalloc.h5) format name and versions: frozen numbers, read by its
// reader/writer (alloc_file.hpp) and by the check every kvq file passes (kvq_file.hpp).
#include <cstddef>
#include <cstdint>

namespace kvq {

inline constexpr const char* kAllocFormat = "kvq-allocation";
// Written to disk; bump on any layout change (schemas/allocation-file.md, "Versions").
//  1: kinds tq-groups, lowrank-hadamard, kivi.
//  2: adds kind "minifloat" (FP8 / NVFP4 with a static scale) and the manifest's
//     "norm_correction" (TQ heads decode rho Pi^T c/||c||; absent = false) and each TQ group's
//     "rotation" (haar / identity; absent = haar).
//  3: adds each TQ group's "codebook" ("exact": the unit-sphere coordinate law at m, written only
//     then; absent = gaussian) and each TQ head's "norm_correction" (written, on every TQ head and
//     instead of the manifest's, only when the TQ heads differ: kvq-allocate --norm-correction
//     auto). A version-2 reader would decode an exact group with the Gaussian table, or every
//     head with one setting, silently wrong, so such files carry 3 and older readers refuse them.
// A file is written at the oldest version that holds its decisions (1 unless it has a minifloat
// head, TQ heads with norm correction or an unrotated group: 2; an exact-codebook group or TQ heads
// that differ in norm correction: 3; compact group norms: 4; a manifest too large for an attribute:
// 5; K and V of different dims or a recorded softmax scale: 6), so
// kvq builds that read only older versions still read every file they can understand and refuse
// the others by version; files without the newer fields keep their bytes.
inline constexpr int64_t kAllocVersion = 8;
inline constexpr int64_t kAllocOldestVersion = 1;
inline constexpr int64_t kAllocMinifloatVersion = 2;
inline constexpr int64_t kAllocNormCorrectionVersion = 2;
inline constexpr int64_t kAllocGroupRotationVersion = 2;  // tq-groups groups[].rotation (haar / identity)
// tq-groups groups[].codebook ("exact": the unit-sphere coordinate law, TqCodebook::kSphere;
// written only then, absent = gaussian, so files without it keep their bytes); refused in 1 and 2
inline constexpr int64_t kAllocGroupCodebookVersion = 3;
// tq-groups heads[].norm_correction (per head; written only when the TQ heads differ); refused in 1, 2
inline constexpr int64_t kAllocHeadNormCorrectionVersion = 3;
// tq-groups heads[].group_norms (compact group norms: one 16-bit record per token, the ratio
// codebook in /tensors); written only for such heads, refused in 1..3 (a version-3 reader would read
// the record as group 0's fp16 norm and every other group's norm from the codes: wrong, silently)
inline constexpr int64_t kAllocCompactNormsVersion = 4;
// The manifest as the root dataset /manifest (u8, its JSON's UTF-8 bytes) instead of the root
// attribute: written only when the manifest is too large for an HDF5 attribute (more than
// kAllocManifestAttrMax bytes: any model of the size people run, e.g. 32 layers x 8 KV heads),
// so smaller files keep their bytes. A version-4 reader looks for the attribute and would fail
// with "attribute missing"; the bump makes it say a newer kvq wrote the file instead.
inline constexpr int64_t kAllocManifestDatasetVersion = 5;
// manifest.calibration's "head_dim_v" (V decisions at that dim: MLA's served cache, K 576, V 512)
// and "softmax_scale" (every logit metric's scale): written only when they differ from head_dim and
// 1/sqrt(head_dim), refused in 1..5 (a version-5 reader would read the V heads at head_dim).
inline constexpr int64_t kAllocKvDimsVersion = 6;
// Coding kind vllm-turboquant (vLLM's TurboQuant cache: heads[].bits 3/4/8/16) and method
// vllm-turboquant (summary.params: preset, kept_layers, the measured errors): 7.
inline constexpr int64_t kAllocVllmTurboQuantVersion = 7;
// manifest.calibration's "decoder_layers" / "n_decoder_layers": a hybrid model's (Qwen3.5) KV layers
// among its decoder layers, which exports name; written only for such models, refused in 1..7.
inline constexpr int64_t kAllocHybridVersion = 8;
inline constexpr size_t kAllocManifestAttrMax = 60000;          // HDF5's limit is 64 KiB per header message
inline constexpr size_t kAllocManifestMaxBytes = size_t(1) << 30;  // what a reader accepts

}  // namespace kvq
