// A projection's bias (crate::bias): `y + b` over rows of `cols`, and the
// bias's gradient, the column sums of the output's gradient, summed in f32
// (candle's reduction summed in the storage type, so in bf16 the sum over a
// batch's rows rounded at every step) in two passes without atomics: rows
// in chunks into f32 partials, then the partials in chunk order.

#include "column_sums.cuh"
#include "convert.cuh"

// out = y + b, grid-strided over the n = rows · cols elements.
template <typename T>
__device__ void bias_add(const T *y, const T *b, T *out, unsigned long long n, unsigned cols) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = from_f32<T>(to_f32(y[i]) + to_f32(b[i % cols]));
}

// Block (c, k): column j = k · blockDim.x + threadIdx.x of rows
// c · per .. min((c + 1) · per, rows), into partial[c · cols + j].
template <typename T>
__device__ void column_sums_partial(const T *g, float *partial, int rows, int cols, int per) {
    int j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    int end = min((int)(blockIdx.x + 1) * per, rows);
    float s = 0.f;
    for (int row = blockIdx.x * per; row < end; row++) s += to_f32(g[(size_t)row * cols + j]);
    partial[(size_t)blockIdx.x * cols + j] = s;
}

#define BIAS(NAME, T)                                                                              \
    extern "C" __global__ void bias_add_##NAME(const T *y, const T *b, T *out,                    \
                                               unsigned long long n, unsigned cols) {              \
        bias_add<T>(y, b, out, n, cols);                                                           \
    }                                                                                              \
    extern "C" __global__ void column_sums_partial_##NAME(const T *g, float *partial, int rows,    \
                                                          int cols, int per) {                     \
        column_sums_partial<T>(g, partial, rows, cols, per);                                       \
    }                                                                                              \
    extern "C" __global__ void column_sums_finish_##NAME(const float *partial, T *out,            \
                                                         int chunks, int cols) {                   \
        sum_partials<T>(partial, out, chunks, cols);                                               \
    }

BIAS(f32, float)
BIAS(bf16, __nv_bfloat16)
BIAS(f16, __half)
