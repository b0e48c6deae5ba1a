// Rotary embedding fused with the head transpose and a scale on a GPU
// (crate::ops RopeHeads), in f32 whatever the storage type. Forward,
// [B, T, H, D] → [B, H, T, D]:
//   out = scale · [x1·cos − x2·sin, x2·cos + x1·sin];
// adjoint (its own gradient), [B, H, T, D] → [B, T, H, D]:
//   dx = scale · [g1·cos + g2·sin, g2·cos − g1·sin],
// with x1, x2 the two halves of a head's D values and cos, sin: [T, D/2]
// (the same positions for every sequence). One thread per pair (i, i + D/2).

#include "convert.cuh"

template <typename T>
__device__ void rope_heads(const T *x, const T *cos, const T *sin, T *out, uint32_t b,
                           uint32_t t, uint32_t h, uint32_t d, float scale, int adjoint) {
    const uint32_t half = d / 2;
    const uint64_t n = (uint64_t)b * t * h * half;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        // i runs over [B, T, H, D/2]: consecutive threads read and write
        // consecutive values of one head in both layouts.
        const uint32_t j = i % half;
        uint64_t r = i / half;
        const uint32_t hi = r % h;
        r /= h;
        const uint32_t ti = r % t;
        const uint64_t bi = r / t;
        const uint64_t bthd = ((bi * t + ti) * h + hi) * d;
        const uint64_t bhtd = ((bi * h + hi) * t + ti) * d;
        const uint64_t src = adjoint ? bhtd : bthd, dst = adjoint ? bthd : bhtd;
        const float c = to_f32(cos[(uint64_t)ti * half + j]);
        const float s = to_f32(sin[(uint64_t)ti * half + j]);
        const float a = to_f32(x[src + j]), e = to_f32(x[src + half + j]);
        const float o1 = adjoint ? a * c + e * s : a * c - e * s;
        const float o2 = adjoint ? e * c - a * s : e * c + a * s;
        out[dst + j] = from_f32<T>(o1 * scale);
        out[dst + half + j] = from_f32<T>(o2 * scale);
    }
}

#define ROPE(NAME, T)                                                                              \
    extern "C" __global__ void rope_heads_##NAME(const T *x, const T *cos, const T *sin, T *out,  \
                                                 uint32_t b, uint32_t t, uint32_t h, uint32_t d,   \
                                                 float scale, int adjoint) {                       \
        rope_heads<T>(x, cos, sin, out, b, t, h, d, scale, adjoint);                               \
    }

ROPE(f32, float)
ROPE(bf16, __nv_bfloat16)
ROPE(f16, __half)

// A decode step's keys as they come out of their projection's GEMM,
// [B, heads, hd]: with `bias` (flag 1, [heads, hd]) each head's bias
// added, then rotated at row b's position, `cs` [B, hd] holding its cos
// then its sin (crate::fixed_step::rope_step). In f32, rounded once; the
// bias add and the rotation were two launches. One thread per pair
// (j, j + hd/2) of a head.
template <typename T>
__device__ void rope_step(const T *x, const T *bias, const T *cs, T *out, uint32_t b,
                          uint32_t heads, uint32_t d, int flags) {
    const uint32_t half = d / 2;
    const uint64_t n = (uint64_t)b * heads * half;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const uint32_t j = i % half;
        const uint64_t r = i / half;  // (row, head)
        const uint32_t hi = r % heads;
        const uint64_t bi = r / heads;
        const T *xr = x + r * d;
        float a = to_f32(xr[j]), e = to_f32(xr[half + j]);
        if (flags & 1) {
            a += to_f32(bias[(uint64_t)hi * d + j]);
            e += to_f32(bias[(uint64_t)hi * d + half + j]);
        }
        const float c = to_f32(cs[bi * d + j]), s = to_f32(cs[bi * d + half + j]);
        out[r * d + j] = from_f32<T>(a * c - e * s);
        out[r * d + half + j] = from_f32<T>(e * c + a * s);
    }
}

#define ROPE_STEP(NAME, T)                                                                         \
    extern "C" __global__ void rope_step_##NAME(const T *x, const T *bias, const T *cs, T *out,   \
                                                uint32_t b, uint32_t heads, uint32_t d,            \
                                                int flags) {                                       \
        rope_step<T>(x, bias, cs, out, b, heads, d, flags);                                        \
    }

ROPE_STEP(f32, float)
ROPE_STEP(bf16, __nv_bfloat16)
ROPE_STEP(f16, __half)
