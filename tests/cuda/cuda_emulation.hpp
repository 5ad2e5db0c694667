#pragma once
// Runs the kvq CUDA kernels on CPU threads so their logic is tested on machines without a GPU:
// one std::thread per CUDA thread for a whole launch, blocks one after another (3-D grids: x fastest), __syncthreads
// as a block barrier, __syncwarp as a barrier of the warp's 32 threads, __shfl_xor_sync through a
// per-warp exchange, static __shared__ as function statics (one block at a time), dynamic shared
// memory poisoned with NaN so a read before a write shows up. A block whose threads all return
// early never meets a barrier, as on the GPU; a barrier that only part of a block or warp reaches
// would hang, so the kernels' barriers must be uniform (as CUDA requires of them).
// Enough for these kernels (1-D blocks, float shuffles); not a general CUDA emulator, and it
// cannot find data races between threads that the barrier structure hides.
#if defined(__CUDACC__)
#error "cuda_emulation.hpp is for host compilers"
#endif
#include <math.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

struct EmuDim3 {
  unsigned x = 1, y = 1, z = 1;
};

namespace kvq_emu {

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen_ != gen; });
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int n_;
  int count_ = 0;
  uint64_t gen_ = 0;
};

inline thread_local EmuDim3 thread_idx, block_idx;
inline EmuDim3 block_dim, grid_dim;
inline float* dynamic_smem = nullptr;
inline std::unique_ptr<Barrier> block_barrier;
inline std::vector<std::unique_ptr<Barrier>> warp_barriers;
inline std::vector<float> warp_slots;

// Runs body() as grid.x * grid.y * grid.z blocks of `threads` threads with `smem_bytes` of dynamic shared
// memory.
inline void launch(EmuDim3 grid, int threads, size_t smem_bytes, const std::function<void()>& body) {
  grid_dim = grid;
  block_dim = EmuDim3{static_cast<unsigned>(threads), 1, 1};
  std::vector<float> smem(smem_bytes / sizeof(float) + 1, std::numeric_limits<float>::quiet_NaN());
  dynamic_smem = smem.data();
  block_barrier = std::make_unique<Barrier>(threads);
  warp_barriers.clear();
  for (int w = 0; w < (threads + 31) / 32; ++w) warp_barriers.push_back(std::make_unique<Barrier>(32));
  warp_slots.assign(static_cast<size_t>(threads), 0.f);
  // One thread per CUDA thread for the whole launch, running the blocks in turn; between two
  // blocks every thread waits, and thread 0 poisons the shared memory again.
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      thread_idx = EmuDim3{static_cast<unsigned>(t), 0, 0};
      for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
          for (unsigned bx = 0; bx < grid.x; ++bx) {
            block_idx = EmuDim3{bx, by, bz};
            body();
            block_barrier->wait();
            if (t == 0) std::fill(smem.begin(), smem.end(), std::numeric_limits<float>::quiet_NaN());
            block_barrier->wait();
          }
    });
  for (std::thread& th : pool) th.join();
}

}  // namespace kvq_emu

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define threadIdx (::kvq_emu::thread_idx)
#define blockIdx (::kvq_emu::block_idx)
#define blockDim (::kvq_emu::block_dim)
#define gridDim (::kvq_emu::grid_dim)
#define KVQ_DYNAMIC_SMEM(name) float* name = ::kvq_emu::dynamic_smem

inline void __syncthreads() { kvq_emu::block_barrier->wait(); }

inline void __syncwarp(unsigned /*mask*/ = 0xffffffffu) {
  kvq_emu::warp_barriers[kvq_emu::thread_idx.x / 32]->wait();
}

inline float __shfl_xor_sync(unsigned /*mask*/, float v, int lane_mask) {
  const int t = static_cast<int>(kvq_emu::thread_idx.x);
  const int w = t / 32, lane = t % 32;
  kvq_emu::warp_slots[static_cast<size_t>(t)] = v;
  kvq_emu::warp_barriers[static_cast<size_t>(w)]->wait();
  const float r = kvq_emu::warp_slots[static_cast<size_t>(w * 32 + (lane ^ lane_mask))];
  kvq_emu::warp_barriers[static_cast<size_t>(w)]->wait();
  return r;
}

inline float __fmul_rn(float a, float b) { return a * b; }
inline int min(int a, int b) { return a < b ? a : b; }
