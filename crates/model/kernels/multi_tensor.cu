// The optimizer's passes over all parameters in one launch each
// (crate::multi_tensor): the gradients' sum of squares, their scaling by the
// clipping factor, and the AdamW update. A model's few hundred parameters
// then cost three launches a step instead of several per parameter.
//
// `tensors` holds FIELDS u64 per tensor: element addresses, then the element
// count last. `chunks` holds 2 u64 per block: the tensor's index and the
// first element of the block's chunk, which spans `chunk` elements or up to
// the tensor's end. The arithmetic is f32 whatever the storage type.

#include "convert.cuh"
#include "block_sum.cuh"

// This block's tensor (its row of `fields` u64 in `tensors`) and the element
// range [*start, *end) of its chunk.
__device__ __forceinline__ const uint64_t *chunk_of(const uint64_t *tensors, int fields,
                                                    const uint64_t *chunks, uint64_t chunk,
                                                    uint64_t *start, uint64_t *end) {
    const uint64_t *row = tensors + chunks[2 * (size_t)blockIdx.x] * fields;
    *start = chunks[2 * (size_t)blockIdx.x + 1];
    uint64_t n = row[fields - 1];
    *end = *start + chunk < n ? *start + chunk : n;
    return row;
}

// partial[block] = Σ g² over the block's chunk; tensors: (g, n).
template <typename T>
__device__ void sum_squares(const uint64_t *tensors, const uint64_t *chunks, uint64_t chunk,
                            float *partial) {
    uint64_t start, end;
    const uint64_t *row = chunk_of(tensors, 2, chunks, chunk, &start, &end);
    const T *g = (const T *)row[0];
    float s = 0.f;
    for (uint64_t i = start + threadIdx.x; i < end; i += blockDim.x) {
        float x = to_f32(g[i]);
        s += x * x;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// g ← g · coef in place; tensors: (g, n), no two rows overlapping.
template <typename T>
__device__ void scale(const uint64_t *tensors, const uint64_t *chunks, uint64_t chunk, float coef) {
    uint64_t start, end;
    const uint64_t *row = chunk_of(tensors, 2, chunks, chunk, &start, &end);
    T *g = (T *)row[0];
    for (uint64_t i = start + threadIdx.x; i < end; i += blockDim.x) {
        g[i] = from_f32<T>(to_f32(g[i]) * coef);
    }
}

// One AdamW step in place, as the CPU's:
//   m ← β1 m + (1-β1) g,  v ← β2 v + (1-β2) g²,
//   θ ← θ·keep - lr (m / bc1) / (sqrt(v / bc2) + ε),  keep = 1 - lr·wd;
// tensors: (θ, g, m, v, n).
template <typename T>
__device__ void adamw(const uint64_t *tensors, const uint64_t *chunks, uint64_t chunk, float lr,
                      float beta1, float beta2, float eps, float keep, float bc1, float bc2) {
    uint64_t start, end;
    const uint64_t *row = chunk_of(tensors, 5, chunks, chunk, &start, &end);
    T *theta = (T *)row[0];
    const T *g = (const T *)row[1];
    T *m_ = (T *)row[2];
    T *v_ = (T *)row[3];
    for (uint64_t i = start + threadIdx.x; i < end; i += blockDim.x) {
        float gi = to_f32(g[i]);
        float m = to_f32(m_[i]) * beta1 + gi * (1.f - beta1);
        float v = to_f32(v_[i]) * beta2 + gi * gi * (1.f - beta2);
        float update = (m / bc1) / (sqrtf(v / bc2) + eps);
        theta[i] = from_f32<T>(to_f32(theta[i]) * keep - update * lr);
        m_[i] = from_f32<T>(m);
        v_[i] = from_f32<T>(v);
    }
}

#define MULTI_TENSOR(NAME, T)                                                                      \
    extern "C" __global__ void multi_sum_squares_##NAME(const uint64_t *tensors,                  \
                                                        const uint64_t *chunks, uint64_t chunk,    \
                                                        float *partial) {                          \
        sum_squares<T>(tensors, chunks, chunk, partial);                                           \
    }                                                                                              \
    extern "C" __global__ void multi_scale_##NAME(const uint64_t *tensors, const uint64_t *chunks, \
                                                  uint64_t chunk, float coef) {                    \
        scale<T>(tensors, chunks, chunk, coef);                                                    \
    }                                                                                              \
    extern "C" __global__ void multi_adamw_##NAME(                                                 \
        const uint64_t *tensors, const uint64_t *chunks, uint64_t chunk, float lr, float beta1,    \
        float beta2, float eps, float keep, float bc1, float bc2) {                                \
        adamw<T>(tensors, chunks, chunk, lr, beta1, beta2, eps, keep, bc1, bc2);                   \
    }

MULTI_TENSOR(f32, float)
MULTI_TENSOR(bf16, __nv_bfloat16)
MULTI_TENSOR(f16, __half)
