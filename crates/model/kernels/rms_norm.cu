// RMSNorm and its backward on a GPU (crate::ops RmsNorm, RmsNormBwdX,
// RmsNormBwdW), f32 arithmetic whatever the storage type. Per row of d:
// r = 1 / sqrt(mean(x²) + ε), y = x r w; dx = r (g ⊙ w) − x r³ Σ(g ⊙ w ⊙ x) / d;
// dw = Σ_rows g ⊙ x r, summed per chunk of rows into f32 partials, then
// over the chunks in a fixed order (the same bits on every run).

#include "convert.cuh"
#include "block_sum.cuh"
#include "column_sums.cuh"

template <typename T> __device__ float inv_rms(const T *xr, int d, float eps) {
    float ss = 0.f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float v = to_f32(xr[j]);
        ss += v * v;
    }
    return rsqrtf(block_sum(ss) / d + eps);
}

template <typename T> __device__ void rms_fwd(const T *x, const T *w, T *y, int d, float eps) {
    size_t row = blockIdx.x;
    const T *xr = x + row * d;
    float r = inv_rms(xr, d, eps);
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        y[row * d + j] = from_f32<T>(to_f32(xr[j]) * r * to_f32(w[j]));
    }
}

template <typename T>
__device__ void rms_bwd_x(const T *x, const T *w, const T *g, T *dx, int d, float eps) {
    size_t row = blockIdx.x;
    const T *xr = x + row * d;
    const T *gr = g + row * d;
    float r = inv_rms(xr, d, eps);
    float dot = 0.f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        dot += to_f32(gr[j]) * to_f32(w[j]) * to_f32(xr[j]);
    }
    float c = r * r * r * block_sum(dot) / d;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        dx[row * d + j] = from_f32<T>(r * to_f32(gr[j]) * to_f32(w[j]) - to_f32(xr[j]) * c);
    }
}

// Block b sums rows b*per .. min((b+1)*per, rows) into partial[b * d ..]
// (zeroed beforehand; only this block touches its row of partials).
template <typename T>
__device__ void rms_bwd_w_partial(const T *x, const T *g, float *partial, int rows, int d,
                                  float eps, int per) {
    float *p = partial + (size_t)blockIdx.x * d;
    int end = min((blockIdx.x + 1) * per, rows);
    for (int row = blockIdx.x * per; row < end; row++) {
        const T *xr = x + (size_t)row * d;
        const T *gr = g + (size_t)row * d;
        float r = inv_rms(xr, d, eps);
        for (int j = threadIdx.x; j < d; j += blockDim.x) p[j] += to_f32(gr[j]) * to_f32(xr[j]) * r;
    }
}


#define RMS_NORM(NAME, T)                                                                          \
    extern "C" __global__ void rms_norm_fwd_##NAME(const T *x, const T *w, T *y, int d,           \
                                                   float eps) {                                    \
        rms_fwd<T>(x, w, y, d, eps);                                                               \
    }                                                                                              \
    extern "C" __global__ void rms_norm_bwd_x_##NAME(const T *x, const T *w, const T *g, T *dx,   \
                                                     int d, float eps) {                           \
        rms_bwd_x<T>(x, w, g, dx, d, eps);                                                         \
    }                                                                                              \
    extern "C" __global__ void rms_norm_bwd_w_partial_##NAME(const T *x, const T *g,              \
                                                             float *partial, int rows, int d,      \
                                                             float eps, int per) {                 \
        rms_bwd_w_partial<T>(x, g, partial, rows, d, eps, per);                                    \
    }                                                                                              \
    extern "C" __global__ void rms_norm_bwd_w_sum_##NAME(const float *partial, T *dw, int chunks,  \
                                                         int d) {                                  \
        sum_partials<T>(partial, dw, chunks, d);                                                  \
    }

RMS_NORM(f32, float)
RMS_NORM(bf16, __nv_bfloat16)
RMS_NORM(f16, __half)
