// The token choice of the graph decoder on the device (crate::graph_decode):
// one block per row of logits x[V], so that a decode step brings back a
// token and a log-prob per row instead of the whole [B, V] logits.
//
// Per row: the first NaN or infinite logit, if any (bad[row] = its index,
// bad_value[row] = it; nothing else is written); otherwise the untempered
// log-softmax normaliser L = max + log Σ e^(x-max), and
//  - u[row] < 0: greedy, the lowest index among the maxima;
//  - else a draw from softmax(x / T) by inverse CDF over the vocabulary in
//    order: weights w = e^((x-max)/T), the target u Σw, found in the
//    contiguous segment of the thread whose running sum passes it.
// token[row] and logprob[row] = x[token] - L. f32 arithmetic, f64 sums of
// the segments, whatever the storage type.

#include "convert.cuh"
#include "block_sum.cuh"

// A candidate for the maximum: its value and index (lower index wins ties).
struct Best {
    float x;
    int j;
};

__device__ __forceinline__ Best better(Best a, Best b) {
    return (b.x > a.x || (b.x == a.x && b.j < a.j)) ? b : a;
}

// The block's reduction of one value per thread (blockDim.x a multiple of
// 32): max-with-lowest-index, min, or sum, returned to every thread.
__device__ Best block_best(Best v) {
    __shared__ float px[32];
    __shared__ int pj[32];
    for (int o = 16; o > 0; o >>= 1) {
        Best w = {__shfl_xor_sync(0xffffffff, v.x, o), __shfl_xor_sync(0xffffffff, v.j, o)};
        v = better(v, w);
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) {
        px[warp] = v.x;
        pj[warp] = v.j;
    }
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x / 32) ? Best{px[lane], pj[lane]} : Best{-INFINITY, 0x7fffffff};
        for (int o = 16; o > 0; o >>= 1) {
            Best w = {__shfl_xor_sync(0xffffffff, v.x, o), __shfl_xor_sync(0xffffffff, v.j, o)};
            v = better(v, w);
        }
        if (lane == 0) {
            px[0] = v.x;
            pj[0] = v.j;
        }
    }
    __syncthreads();
    return Best{px[0], pj[0]};
}

__device__ int block_min(int v) {
    __shared__ int part[32];
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffff, v, o));
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x / 32) ? part[lane] : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffff, v, o));
        if (lane == 0) part[0] = v;
    }
    __syncthreads();
    return part[0];
}

template <typename T>
__device__ void sample_rows(const T *logits, int v, const double *u, float inv_t,
                            uint32_t *token, float *logprob, int *bad, float *bad_value) {
    // One f64 running sum per thread of a block of at most 1024.
    __shared__ double seg_sum[1024];
    size_t row = blockIdx.x;
    const T *x = logits + row * v;
    Best best = {-INFINITY, 0x7fffffff};
    int first_bad = 0x7fffffff;
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
        float xj = to_f32(x[j]);
        if (!isfinite(xj)) first_bad = min(first_bad, j);
        best = better(best, Best{xj, j});
    }
    first_bad = block_min(first_bad);
    if (first_bad != 0x7fffffff) {
        if (threadIdx.x == 0) {
            bad[row] = first_bad;
            bad_value[row] = to_f32(x[first_bad]);
        }
        return;
    }
    best = block_best(best);
    float mx = best.x;
    float s = 0.f;
    for (int j = threadIdx.x; j < v; j += blockDim.x) s += expf(to_f32(x[j]) - mx);
    float lse = mx + logf(block_sum(s));
    double draw = u[row];
    int pick = best.j;
    if (draw >= 0.0) {
        // Thread k's contiguous segment [k·seg, (k+1)·seg) of the weights.
        int seg = (v + blockDim.x - 1) / blockDim.x;
        int lo = min((int)threadIdx.x * seg, v), hi = min(lo + seg, v);
        float w = 0.f;
        for (int j = lo; j < hi; j++) w += expf((to_f32(x[j]) - mx) * inv_t);
        seg_sum[threadIdx.x] = w;
        __syncthreads();
        if (threadIdx.x == 0) {
            double total = 0.0;
            for (int k = 0; k < (int)blockDim.x; k++) total += seg_sum[k];
            double target = draw * total;
            int k = 0, last = 0;
            for (; k < (int)blockDim.x; k++) {
                if (seg_sum[k] > 0.0) last = k;
                if (target < seg_sum[k]) break;
                target -= seg_sum[k];
            }
            // Rounding can leave the target a hair past the last segment.
            if (k == (int)blockDim.x) {
                k = last;
                target = seg_sum[k];
            }
            int a = min(k * seg, v), b = min(a + seg, v);
            pick = a;
            for (int j = a; j < b; j++) {
                double wj = expf((to_f32(x[j]) - mx) * inv_t);
                if (wj > 0.0) pick = j;
                if (target < wj) break;
                target -= wj;
            }
        }
    }
    if (threadIdx.x == 0) {
        bad[row] = -1;
        token[row] = (uint32_t)pick;
        logprob[row] = to_f32(x[pick]) - lse;
    }
}

#define SAMPLE(NAME, T)                                                                            \
    extern "C" __global__ void sample_rows_##NAME(const T *logits, int v, const double *u,        \
                                                  float inv_t, uint32_t *token, float *logprob,    \
                                                  int *bad, float *bad_value) {                    \
        sample_rows<T>(logits, v, u, inv_t, token, logprob, bad, bad_value);                       \
    }

SAMPLE(f32, float)
SAMPLE(bf16, __nv_bfloat16)
SAMPLE(f16, __half)
