// C-ABI wrapper around libsentencepiece, built as a loadable module.
//
// Why: Debian's libsentencepiece exports a bundled copy of protobuf-lite 3.14, and libtorch pulls
// in the system libprotobuf 3.21. In one symbol namespace either the protobuf static initialisers
// crash or sentencepiece's version check aborts. tokenizer.cpp therefore dlmopen()s this module into
// its own link-map namespace; only plain C types cross the boundary (the two sides have separate
// heaps, so every buffer is owned and freed by the caller).
#include <sentencepiece_processor.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

namespace {

void put_error(const std::string& msg, char* err, size_t cap) {
  if (!err || cap == 0) return;
  const size_t n = std::min(msg.size(), cap - 1);
  std::memcpy(err, msg.data(), n);
  err[n] = '\0';
}

}  // namespace

extern "C" {

// Returns a processor, or null with a message in err.
__attribute__((visibility("default"))) void* kvq_spm_load(const char* data, size_t n, char* err, size_t cap) {
  auto* sp = new sentencepiece::SentencePieceProcessor();
  const auto st = sp->LoadFromSerializedProto(std::string(data, n));
  if (!st.ok()) {
    put_error(st.ToString(), err, cap);
    delete sp;
    return nullptr;
  }
  return sp;
}

__attribute__((visibility("default"))) void kvq_spm_free(void* h) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(h);
}

// 0: piece count, 1: bos id, 2: eos id, 3: unk id.
__attribute__((visibility("default"))) int kvq_spm_info(const void* h, int what) {
  const auto* sp = static_cast<const sentencepiece::SentencePieceProcessor*>(h);
  switch (what) {
    case 0: return sp->GetPieceSize();
    case 1: return sp->bos_id();
    case 2: return sp->eos_id();
    case 3: return sp->unk_id();
  }
  return -1;
}

// Writes up to `cap` ids; returns the total count (the caller retries with a larger buffer when it
// exceeds cap), or -1 with a message in err.
__attribute__((visibility("default"))) long kvq_spm_encode(const void* h, const char* text, size_t n,
                                                           int* ids, size_t cap, char* err, size_t err_cap) {
  const auto* sp = static_cast<const sentencepiece::SentencePieceProcessor*>(h);
  std::vector<int> out;
  const auto st = sp->Encode(std::string(text, n), &out);
  if (!st.ok()) {
    put_error(st.ToString(), err, err_cap);
    return -1;
  }
  if (out.size() <= cap) std::memcpy(ids, out.data(), out.size() * sizeof(int));
  return long(out.size());
}

// Same protocol as kvq_spm_encode, for bytes of decoded text.
__attribute__((visibility("default"))) long kvq_spm_decode(const void* h, const int* ids, size_t n, char* text,
                                                           size_t cap, char* err, size_t err_cap) {
  const auto* sp = static_cast<const sentencepiece::SentencePieceProcessor*>(h);
  std::string out;
  const auto st = sp->Decode(std::vector<int>(ids, ids + n), &out);
  if (!st.ok()) {
    put_error(st.ToString(), err, err_cap);
    return -1;
  }
  if (out.size() <= cap) std::memcpy(text, out.data(), out.size());
  return long(out.size());
}

}  // extern "C"
