// One AdamW step of one parameter on a GPU (crate::optim), in place: θ and
// its moments mv = [m; v] (2n values, m first), read with the gradient g.
// f32 arithmetic whatever the storage type; the same formula as the CPU's:
//   m ← β1 m + (1-β1) g,  v ← β2 v + (1-β2) g²,
//   θ ← θ (1 - lr·wd) - lr (m / bc1) / (sqrt(v / bc2) + ε).

#include "convert.cuh"

template <typename T>
__device__ void adamw(T *theta, const T *g, T *mv, uint64_t n, float lr, float beta1, float beta2,
                      float eps, float keep, float bc1, float bc2) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        float gi = to_f32(g[i]);
        float m = to_f32(mv[i]) * beta1 + gi * (1.f - beta1);
        float v = to_f32(mv[n + i]) * beta2 + gi * gi * (1.f - beta2);
        float update = (m / bc1) / (sqrtf(v / bc2) + eps);
        theta[i] = from_f32<T>(to_f32(theta[i]) * keep - update * lr);
        mv[i] = from_f32<T>(m);
        mv[n + i] = from_f32<T>(v);
    }
}

#define ADAMW(NAME, T)                                                                             \
    extern "C" __global__ void adamw_##NAME(T *theta, const T *g, T *mv, uint64_t n, float lr,    \
                                            float beta1, float beta2, float eps, float keep,       \
                                            float bc1, float bc2) {                                \
        adamw<T>(theta, g, mv, n, lr, beta1, beta2, eps, keep, bc1, bc2);                          \
    }

ADAMW(f32, float)
ADAMW(bf16, __nv_bfloat16)
ADAMW(f16, __half)
