// Attention's causal softmax on a GPU (crate::ops, CausalSoftmax,
// DecodeSoftmax and SoftmaxBwd): one block per row of s keys, f32 arithmetic whatever the
// storage type. Row r is query i = r % t of batch element r / rows_per_batch,
// which sees keys pads[b] ..= i + s - t (no pads when n_pads is 0); masked
// keys get exactly 0, and a row that sees no key is all zeros.

#include "convert.cuh"

// The block's max (is_max) or sum of v, returned to every thread. blockDim.x
// is a multiple of 32, at most 1024.
__device__ float block_reduce(float v, bool is_max) {
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffff, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // part[] may still be read by an earlier call
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x / 32) ? part[lane] : (is_max ? -INFINITY : 0.f);
        for (int o = 16; o > 0; o >>= 1) {
            float w = __shfl_xor_sync(0xffffffff, v, o);
            v = is_max ? fmaxf(v, w) : v + w;
        }
        if (lane == 0) part[0] = v;
    }
    __syncthreads();
    return part[0];
}

// `last` null: the causal rule above. Otherwise every row sees keys
// pads[b] ..= *last (read on the device: a decode step over a whole cache
// whose newest key's position is not a launch parameter, so that a captured
// CUDA graph can replay it).
template <typename T>
__device__ void causal_softmax(const T *x, T *y, const uint32_t *pads, int n_pads, int t, int s,
                               int rows_per_batch, const uint32_t *last = nullptr) {
    size_t row = blockIdx.x;
    int i = row % t;
    int b = row / rows_per_batch;
    int lo = (n_pads > 0 && b < n_pads) ? (int)pads[b] : 0;
    int hi = last ? (int)min((uint32_t)s, *last + 1u) : min(i + s - t + 1, s);
    const T *xr = x + row * s;
    T *yr = y + row * s;
    if (lo >= hi) {
        for (int j = threadIdx.x; j < s; j += blockDim.x) yr[j] = from_f32<T>(0.f);
        return;
    }
    float m = -INFINITY;
    for (int j = lo + threadIdx.x; j < hi; j += blockDim.x) m = fmaxf(m, to_f32(xr[j]));
    m = block_reduce(m, true);
    float sum = 0.f;
    for (int j = lo + threadIdx.x; j < hi; j += blockDim.x) sum += expf(to_f32(xr[j]) - m);
    float inv = 1.f / block_reduce(sum, false);
    for (int j = threadIdx.x; j < s; j += blockDim.x) {
        float p = (j >= lo && j < hi) ? expf(to_f32(xr[j]) - m) * inv : 0.f;
        yr[j] = from_f32<T>(p);
    }
}

// dx = p (g - Σ_j p_j g_j) per row.
template <typename T> __device__ void softmax_bwd(const T *p, const T *g, T *dx, int s) {
    size_t row = blockIdx.x;
    const T *pr = p + row * s;
    const T *gr = g + row * s;
    T *dr = dx + row * s;
    float dot = 0.f;
    for (int j = threadIdx.x; j < s; j += blockDim.x) dot += to_f32(pr[j]) * to_f32(gr[j]);
    dot = block_reduce(dot, false);
    for (int j = threadIdx.x; j < s; j += blockDim.x) {
        dr[j] = from_f32<T>(to_f32(pr[j]) * (to_f32(gr[j]) - dot));
    }
}

#define SOFTMAX(NAME, T)                                                                           \
    extern "C" __global__ void causal_softmax_##NAME(const T *x, T *y, const uint32_t *pads,      \
                                                     int n_pads, int t, int s,                     \
                                                     int rows_per_batch) {                         \
        causal_softmax<T>(x, y, pads, n_pads, t, s, rows_per_batch);                               \
    }                                                                                              \
    extern "C" __global__ void decode_softmax_##NAME(const T *x, T *y, const uint32_t *pads,      \
                                                     int n_pads, const uint32_t *last, int s,      \
                                                     int rows_per_batch) {                         \
        causal_softmax<T>(x, y, pads, n_pads, 1, s, rows_per_batch, last);                         \
    }                                                                                              \
    extern "C" __global__ void softmax_bwd_##NAME(const T *p, const T *g, T *dx, int s) {         \
        softmax_bwd<T>(p, g, dx, s);                                                               \
    }

SOFTMAX(f32, float)
SOFTMAX(bf16, __nv_bfloat16)
SOFTMAX(f16, __half)
