// SwiGLU's product and its backward on a GPU (crate::ops Swiglu,
// SwigluBwd), elementwise in f32 whatever the storage type:
//   y = silu(a) b,  da = g b σ(a) (1 + a (1 − σ(a))),  db = g silu(a),
// the backward writing da then db into one buffer of 2n.

#include "convert.cuh"

__device__ __forceinline__ float sigmoid(float a) { return 1.f / (1.f + expf(-a)); }

template <typename T> __device__ void swiglu_fwd(const T *a, const T *b, T *y, uint64_t n) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        float av = to_f32(a[i]);
        y[i] = from_f32<T>(av * sigmoid(av) * to_f32(b[i]));
    }
}

template <typename T>
__device__ void swiglu_bwd(const T *a, const T *b, const T *g, T *out, uint64_t n) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        float av = to_f32(a[i]), gv = to_f32(g[i]);
        float s = sigmoid(av);
        out[i] = from_f32<T>(gv * to_f32(b[i]) * s * (1.f + av * (1.f - s)));
        out[n + i] = from_f32<T>(gv * av * s);
    }
}

#define SWIGLU(NAME, T)                                                                            \
    extern "C" __global__ void swiglu_fwd_##NAME(const T *a, const T *b, T *y, uint64_t n) {      \
        swiglu_fwd<T>(a, b, y, n);                                                                 \
    }                                                                                              \
    extern "C" __global__ void swiglu_bwd_##NAME(const T *a, const T *b, const T *g, T *out,      \
                                                 uint64_t n) {                                     \
        swiglu_bwd<T>(a, b, g, out, n);                                                            \
    }

SWIGLU(f32, float)
SWIGLU(bf16, __nv_bfloat16)
SWIGLU(f16, __half)
