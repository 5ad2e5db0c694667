#include "kvq/codec/hadamard.hpp"

#include "kvq/util/rng.hpp"
#include "kvq/util/error.hpp"

namespace kvq::codec {

std::vector<HadamardBlock> hadamard_blocks(int r) {
  KVQ_ASSERT(r >= 0);
  std::vector<HadamardBlock> blocks;
  int offset = 0;
  for (int bit = 30; bit >= 0; --bit) {
    const int size = 1 << bit;
    if (r & size) {
      blocks.push_back({offset, size});
      offset += size;
    }
  }
  return blocks;
}

std::vector<float> hadamard_signs(uint64_t seed, int r) {
  Rng rng(seed);
  std::vector<float> s(static_cast<size_t>(r));
  for (float& v : s) v = (rng.next() >> 63) ? -1.0f : 1.0f;
  return s;
}

std::vector<int> hadamard_interleave(int r) {
  const std::vector<HadamardBlock> blocks = hadamard_blocks(r);
  std::vector<int> filled(blocks.size(), 0);
  std::vector<int> pos(static_cast<size_t>(r));
  for (int k = 0; k < r; ++k) {
    // Largest deficit (k+1) * size_j / r - filled_j, in integers; ties to the larger block.
    size_t best = blocks.size();
    long long best_def = 0;
    for (size_t j = 0; j < blocks.size(); ++j) {
      if (filled[j] == blocks[j].size) continue;
      const long long def = static_cast<long long>(k + 1) * blocks[j].size - static_cast<long long>(filled[j]) * r;
      if (best == blocks.size() || def > best_def) {
        best = j;
        best_def = def;
      }
    }
    KVQ_ASSERT(best < blocks.size());
    pos[static_cast<size_t>(k)] = blocks[best].offset + filled[best]++;
  }
  return pos;
}

void wht_inplace(float* x, int r) {
  int offset = 0;
  for (int bit = 30; bit >= 0; --bit) {  // the blocks of hadamard_blocks(r), without allocating
    const int n = 1 << bit;
    if (!(r & n)) continue;
    float* v = x + offset;
    offset += n;
    for (int h = 1; h < n; h <<= 1) {
      for (int i = 0; i < n; i += 2 * h) {
        for (int j = i; j < i + h; ++j) {
          const float p = v[j], q = v[j + h];
          v[j] = p + q;
          v[j + h] = p - q;
        }
      }
    }
    const float s = wht_scale(n);
    for (int i = 0; i < n; ++i) v[i] *= s;
  }
}

void rht_forward(const float* signs, const int* interleave, const float* y, float* z, int r) {
  for (int k = 0; k < r; ++k) z[interleave[k]] = signs[k] * y[k];
  wht_inplace(z, r);
}

void rht_inverse(const float* signs, const int* interleave, float* z, float* y, int r) {
  wht_inplace(z, r);
  for (int k = 0; k < r; ++k) y[k] = signs[k] * z[interleave[k]];
}

}  // namespace kvq::codec
