// The loss end of the LM head on a GPU (crate::token_loss): per row of
// logits x[V], the log-prob of the target, the entropy H and logsumexp L,
// and the backward pass of those three. One block per row; the arithmetic
// is f32 whatever the logits' storage type, and so are the three outputs
// (log-probs feed importance ratios and KL terms, and L the backward: in
// bf16 each would be off by up to 2⁻⁹ of its size, L ≈ 12 by 0.03).
//
// Forward: one pass with an online (max m, s = Σ e^(x-m), t = Σ e^(x-m)(x-m))
// per thread, merged across the block; L = m + log s, H = log s - t/s.
// Backward, for upstream gradients (g_lp, g_H, g_L) of the three outputs:
//   dx_j = g_lp (δ_j,target - p_j) - g_H p_j (log p_j + H) + g_L p_j.

#include "convert.cuh"

// Running softmax statistics of a set of values: its max m, s = Σ e^(x-m)
// and t = Σ e^(x-m)(x-m); s == 0 marks the empty set.
struct Stats {
    float m, s, t;
};

// a's t re-centred on a max m >= a.m: Σ e^(x-m)(x-m) = e^(a.m-m) (t + (a.m-m) s),
// and 0 where e^(a.m-m) is (so an -inf a.m gives no inf·0).
__device__ __forceinline__ float recentre(Stats a, float m) {
    float e = expf(a.m - m);
    return e > 0.f ? e * (a.t + (a.m - m) * a.s) : 0.f;
}

__device__ __forceinline__ Stats merge(Stats a, Stats b) {
    if (a.s == 0.f) return b;
    if (b.s == 0.f) return a;
    float m = fmaxf(a.m, b.m);
    return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m), recentre(a, m) + recentre(b, m)};
}

// The whole block's Stats, returned to every thread. blockDim.x is a
// multiple of 32, at most 1024.
__device__ Stats block_merge(Stats v) {
    __shared__ float sm[32], ss[32], st[32];
    for (int o = 16; o > 0; o >>= 1) {
        Stats w = {__shfl_xor_sync(0xffffffff, v.m, o), __shfl_xor_sync(0xffffffff, v.s, o),
                   __shfl_xor_sync(0xffffffff, v.t, o)};
        v = merge(v, w);
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    if (lane == 0) {
        sm[warp] = v.m;
        ss[warp] = v.s;
        st[warp] = v.t;
    }
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? Stats{sm[lane], ss[lane], st[lane]} : Stats{0.f, 0.f, 0.f};
        for (int o = 16; o > 0; o >>= 1) {
            Stats w = {__shfl_xor_sync(0xffffffff, v.m, o), __shfl_xor_sync(0xffffffff, v.s, o),
                       __shfl_xor_sync(0xffffffff, v.t, o)};
            v = merge(v, w);
        }
        if (lane == 0) {
            sm[0] = v.m;
            ss[0] = v.s;
            st[0] = v.t;
        }
    }
    __syncthreads();
    return Stats{sm[0], ss[0], st[0]};
}

// out[row] = (log p(target), H, L); a target outside 0..v gives NaN.
template <typename T>
__device__ void token_loss_fwd(const T *logits, const uint32_t *targets, float *out, int v) {
    const T *x = logits + (size_t)blockIdx.x * v;
    Stats acc = {0.f, 0.f, 0.f};
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
        float xj = to_f32(x[j]);
        if (acc.s == 0.f) {
            acc = Stats{xj, 1.f, 0.f};
        } else if (xj > acc.m) {
            acc.t = recentre(acc, xj);
            acc.s = acc.s * expf(acc.m - xj) + 1.f;
            acc.m = xj;
        } else {
            float d = xj - acc.m, e = expf(d);
            acc.s += e;
            acc.t += e * d;
        }
    }
    Stats all = block_merge(acc);
    if (threadIdx.x == 0) {
        float log_s = logf(all.s);
        float lse = all.m + log_s;
        uint32_t target = targets[blockIdx.x];
        float lp = target < (uint32_t)v ? to_f32(x[target]) - lse : nanf("");
        float *o = out + (size_t)blockIdx.x * 3;
        o[0] = lp;
        o[1] = log_s - all.t / all.s;
        o[2] = lse;
    }
}

// aux[row] = (log p(target), H, L, g_lp, g_H, g_L): the forward's outputs
// and their upstream gradients.
template <typename T>
__device__ void token_loss_bwd(const T *logits, const uint32_t *targets, const float *aux, T *dx,
                               int v) {
    size_t row = blockIdx.x;
    const T *x = logits + row * v;
    const float *a = aux + row * 6;
    float h = a[1], lse = a[2];
    float g_lp = a[3], g_h = a[4], g_l = a[5];
    uint32_t target = targets[row];
    T *d = dx + row * v;
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
        float lp = to_f32(x[j]) - lse;
        float p = expf(lp);
        float g = (g_l - g_lp) * p - g_h * p * (lp + h);
        if ((uint32_t)j == target) g += g_lp;
        d[j] = from_f32<T>(g);
    }
}

#define TOKEN_LOSS(NAME, T)                                                                        \
    extern "C" __global__ void token_loss_fwd_##NAME(const T *logits, const uint32_t *targets,    \
                                                     float *out, int v) {                          \
        token_loss_fwd<T>(logits, targets, out, v);                                                \
    }                                                                                              \
    extern "C" __global__ void token_loss_bwd_##NAME(const T *logits, const uint32_t *targets,    \
                                                     const float *aux, T *dx, int v) {             \
        token_loss_bwd<T>(logits, targets, aux, dx, v);                                            \
    }

TOKEN_LOSS(f32, float)
TOKEN_LOSS(bf16, __nv_bfloat16)
TOKEN_LOSS(f16, __half)
