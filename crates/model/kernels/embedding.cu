// The token embedding on a GPU (crate::ops Embedding): rows of the table
// gathered by id, and the table's gradient summed per id in f32.
//
// candle's index_add, the composite's backward, gives the gather's gradient
// to one block of d threads that walks every token in turn and adds in the
// storage type: latency-bound, and a bf16 sum over a prompt repeated across
// a batch rounds at every term. Here block j handles token j: it leaves if
// an earlier token has the same id, else it sums the rows of every token
// with its id, in token order (the same order on every run), in f32, and
// writes that table row once. Rows of ids no token has stay zero.

#include "block_sum.cuh"
#include "convert.cuh"

// out[i, c] = w[ids[i], c] for i < n, c < d; an id past the table (v rows)
// reads as NaN, so a bad id poisons the loss instead of reading memory.
template <typename T>
__device__ void embedding_fwd(const T *w, const uint32_t *ids, T *out, uint64_t n, uint32_t d,
                              uint32_t v) {
    const uint64_t total = n * d;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < total;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const uint32_t id = ids[i / d];
        out[i] = id < v ? w[(uint64_t)id * d + i % d] : from_f32<T>(nanf(""));
    }
}

// The most table columns one thread of embedding_bwd sums (d ≤ 32 · blockDim.x).
#define EMBEDDING_COLUMNS_PER_THREAD 32

// dw[id] = Σ over tokens k with ids[k] = id of g[k], for a zeroed dw of
// v rows; one block per token, blockDim.x a multiple of 32.
template <typename T>
__device__ void embedding_bwd(const uint32_t *ids, const T *g, T *dw, uint32_t n, uint32_t d,
                              uint32_t v) {
    const uint32_t j = blockIdx.x;
    const uint32_t id = ids[j];
    float earlier = 0.f;
    for (uint32_t k = threadIdx.x; k < j; k += blockDim.x) earlier += ids[k] == id ? 1.f : 0.f;
    // Every thread of the block takes the same branch.
    if (block_sum(earlier) > 0.f || id >= v) return;
    float acc[EMBEDDING_COLUMNS_PER_THREAD];
    for (int r = 0; r < EMBEDDING_COLUMNS_PER_THREAD; ++r) acc[r] = 0.f;
    for (uint32_t k = j; k < n; ++k) {
        if (ids[k] != id) continue;
        const T *row = g + (uint64_t)k * d;
        for (int r = 0; r < EMBEDDING_COLUMNS_PER_THREAD; ++r) {
            const uint32_t c = threadIdx.x + r * blockDim.x;
            if (c < d) acc[r] += to_f32(row[c]);
        }
    }
    T *out = dw + (uint64_t)id * d;
    for (int r = 0; r < EMBEDDING_COLUMNS_PER_THREAD; ++r) {
        const uint32_t c = threadIdx.x + r * blockDim.x;
        if (c < d) out[c] = from_f32<T>(acc[r]);
    }
}

#define EMBEDDING(NAME, T)                                                                         \
    extern "C" __global__ void embedding_fwd_##NAME(const T *w, const uint32_t *ids, T *out,      \
                                                    uint64_t n, uint32_t d, uint32_t v) {          \
        embedding_fwd<T>(w, ids, out, n, d, v);                                                    \
    }                                                                                              \
    extern "C" __global__ void embedding_bwd_##NAME(const uint32_t *ids, const T *g, T *dw,       \
                                                    uint32_t n, uint32_t d, uint32_t v) {          \
        embedding_bwd<T>(ids, g, dw, n, d, v);                                                     \
    }

EMBEDDING(f32, float)
EMBEDDING(bf16, __nv_bfloat16)
EMBEDDING(f16, __half)
