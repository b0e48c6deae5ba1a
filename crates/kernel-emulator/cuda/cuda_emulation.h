// The CUDA thread model on the CPU, for testing `crates/model/kernels/*.cu`
// without a GPU: the kernel sources compile unchanged as C++20 with this
// header included first (build.rs), and `agentrl_emulated_launch` runs a grid.
//
// How a launch runs: the blocks one after another, each block's threads as
// real OS threads (blockDim of them, reused across blocks). So
// `__syncthreads` is a barrier over the block, a warp shuffle is an
// exchange through the warp's slots between two barriers of its 32 threads,
// and `__shared__` variables can be plain statics: only one block of one
// grid is alive at a time in the process. A thread that returns early
// leaves the block's and its warp's barriers (as an exited thread stops
// counting on a GPU).
//
// What it does not model: timing, memory ordering weaker than a barrier's,
// warps that diverge (a shuffle or `__syncwarp` is for the whole warp), and
// dynamic shared memory (the kernels use none). Tensor-core fragments (wmma)
// hold their whole tile in every lane, so a fragment's element layout is
// not modelled either: the kernels only go through load, store, fill and
// mma, whose results do not depend on it.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// One block is alive at a time (see above).
#define __shared__ static

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};

namespace agentrl_emulation {

/// The barriers and shuffle slots of one warp.
struct Warp {
    std::barrier<> *barrier;
    uint64_t slot[32];
};

/// What a thread knows of itself and its block during a launch.
struct ThreadState {
    dim3 thread_idx, block_idx, block_dim, grid_dim;
    std::barrier<> *block_barrier;
    Warp *warp;
};

extern thread_local ThreadState self;

/// A wmma store not yet visible to the other threads (see store_matrix_sync).
struct PendingStore {
    float *at;
    float value;
};
extern thread_local std::vector<PendingStore> pending_stores;

/// Makes this thread's pending wmma stores visible: at its next barrier.
inline void flush_stores() {
    for (const PendingStore &s : pending_stores) *s.at = s.value;
    pending_stores.clear();
}

template <typename T> inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "a shuffled value is at most 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    return b;
}

template <typename T> inline T from_bits(uint64_t b) {
    T v;
    memcpy(&v, &b, sizeof(T));
    return v;
}

/// Lane `src`'s `v`, every lane of the warp taking part.
template <typename T> inline T exchange(T v, unsigned src) {
    Warp *w = self.warp;
    unsigned lane = self.thread_idx.x % 32;
    w->slot[lane] = to_bits(v);
    w->barrier->arrive_and_wait();
    T r = from_bits<T>(w->slot[src % 32]);
    // Nobody overwrites a slot before every lane has read its source.
    w->barrier->arrive_and_wait();
    return r;
}

}  // namespace agentrl_emulation

#define threadIdx (agentrl_emulation::self.thread_idx)
#define blockIdx (agentrl_emulation::self.block_idx)
#define blockDim (agentrl_emulation::self.block_dim)
#define gridDim (agentrl_emulation::self.grid_dim)

inline void __syncthreads() {
    agentrl_emulation::flush_stores();
    agentrl_emulation::self.block_barrier->arrive_and_wait();
}
inline void __syncwarp(unsigned = 0xffffffffu) {
    agentrl_emulation::flush_stores();
    agentrl_emulation::self.warp->barrier->arrive_and_wait();
}

template <typename T> inline T __shfl_xor_sync(unsigned, T v, int lane_mask, int = 32) {
    return agentrl_emulation::exchange(v, (threadIdx.x % 32) ^ (unsigned)lane_mask);
}
template <typename T> inline T __shfl_sync(unsigned, T v, int src, int = 32) {
    return agentrl_emulation::exchange(v, (unsigned)src);
}
template <typename T> inline T __shfl_down_sync(unsigned, T v, unsigned delta, int = 32) {
    unsigned lane = threadIdx.x % 32;
    return agentrl_emulation::exchange(v, lane + delta < 32 ? lane + delta : lane);
}

template <typename T> inline T atomicAdd(T *p, T v) {
    return std::atomic_ref<T>(*p).fetch_add(v);
}

// CUDA's min and max take mixed integer types.
template <typename A, typename B> inline std::common_type_t<A, B> min(A a, B b) {
    using C = std::common_type_t<A, B>;
    return (C)a < (C)b ? (C)a : (C)b;
}
template <typename A, typename B> inline std::common_type_t<A, B> max(A a, B b) {
    using C = std::common_type_t<A, B>;
    return (C)a > (C)b ? (C)a : (C)b;
}

inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __int_as_float(int x) { return agentrl_emulation::from_bits<float>((uint32_t)x); }
inline int __float_as_int(float x) { return (int)(uint32_t)agentrl_emulation::to_bits(x); }
template <typename T> inline T __ldg(const T *p) { return *p; }

// The storage types of cuda_bf16.h and cuda_fp16.h, with the conversions the
// kernels use: round to nearest even, as the device's.
struct __nv_bfloat16 {
    uint16_t bits;
};
inline float __bfloat162float(__nv_bfloat16 h) {
    return agentrl_emulation::from_bits<float>((uint64_t)h.bits << 16);
}
inline __nv_bfloat16 __float2bfloat16(float f) {
    uint32_t u = (uint32_t)agentrl_emulation::to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return {(uint16_t)((u >> 16) | 0x40)};  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return {(uint16_t)(u >> 16)};
}

struct __half {
    _Float16 value;
};
inline float __half2float(__half h) { return (float)h.value; }
inline __half __float2half(float f) { return {(_Float16)f}; }

namespace agentrl_emulation {
inline float as_float(float x) { return x; }
inline float as_float(__nv_bfloat16 x) { return __bfloat162float(x); }
inline float as_float(__half x) { return __half2float(x); }
}  // namespace agentrl_emulation

// mma.h's warp-wide matrix tiles. A tile is loaded whole by every lane (it
// may read what other lanes wrote, so a missing __syncwarp before a load
// shows), an mma is computed by every lane on its own copy (f32 sums in k
// order, as exact products of the 16-bit inputs), and a store is shared out:
// lane L writes the elements e with e % 32 == L, as a warp's lanes each
// write their part on a device, and its writes land only at L's next
// __syncwarp or __syncthreads (or when the kernel returns). Which lane holds
// which element is unspecified on a device, so no lane may read a stored
// tile before such a barrier; here one that does reads the old values.
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    static constexpr int rows = std::is_same_v<Use, matrix_b> ? K : M;
    static constexpr int cols = std::is_same_v<Use, matrix_a> ? K : N;
    static constexpr int num_elements = rows * cols;
    float x[num_elements];
};

template <typename Use, int M, int N, int K, typename T, typename L>
inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, float v) {
    for (float &e : f.x) e = v;
}

template <typename Frag, typename P>
inline void load_tile(Frag &f, const P *p, unsigned ldm, bool row_major_memory) {
    for (int r = 0; r < Frag::rows; ++r)
        for (int c = 0; c < Frag::cols; ++c)
            f.x[r * Frag::cols + c] = agentrl_emulation::as_float(
                row_major_memory ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]);
}

template <typename Use, int M, int N, int K, typename T, typename P>
inline void load_matrix_sync(fragment<Use, M, N, K, T, row_major> &f, const P *p, unsigned ldm) {
    load_tile(f, p, ldm, true);
}
template <typename Use, int M, int N, int K, typename T, typename P>
inline void load_matrix_sync(fragment<Use, M, N, K, T, col_major> &f, const P *p, unsigned ldm) {
    load_tile(f, p, ldm, false);
}
template <int M, int N, int K>
inline void load_matrix_sync(fragment<accumulator, M, N, K, float> &f, const float *p,
                             unsigned ldm, layout_t layout) {
    load_tile(f, p, ldm, layout == mem_row_major);
}

template <int M, int N, int K>
inline void store_matrix_sync(float *p, const fragment<accumulator, M, N, K, float> &f,
                              unsigned ldm, layout_t layout) {
    unsigned lane = threadIdx.x % 32;
    for (int e = (int)lane; e < M * N; e += 32) {
        int r = e / N, c = e % N;
        float *at = p + (layout == mem_row_major ? (size_t)r * ldm + c : (size_t)c * ldm + r);
        agentrl_emulation::pending_stores.push_back({at, f.x[e]});
    }
}

template <int M, int N, int K, typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, M, N, K, float> &d,
                     const fragment<matrix_a, M, N, K, T, LA> &a,
                     const fragment<matrix_b, M, N, K, T, LB> &b,
                     const fragment<accumulator, M, N, K, float> &c) {
    float out[M * N];
    for (int r = 0; r < M; ++r)
        for (int n = 0; n < N; ++n) {
            float acc = c.x[r * N + n];
            for (int k = 0; k < K; ++k) acc += a.x[r * K + k] * b.x[k * N + n];
            out[r * N + n] = acc;
        }
    for (int e = 0; e < M * N; ++e) d.x[e] = out[e];
}
}  // namespace wmma
}  // namespace nvcuda
