// Attention without the materialised score matrix, forward and backward, on
// tensor cores (crate::flash_attention): softmax(scale · q kᵀ) v with the
// causal rule and left pads of crate::ops' causal softmax. Query row i of
// batch element b sees keys pads[b] ..= i + s - t; a row that sees no key
// is all zeros, with log-sum-exp -inf. Grouped-query: query head h reads kv
// head h / (heads / kv_heads).
//
// The forward keeps each row's running max and sum (FlashAttention's online
// softmax) and writes the output and the row's log-sum-exp, which the
// backward recomputes the probabilities from (FlashAttention-2): one kernel
// takes Δ_i = Σ_d dO_id O_id, one sums dK and dV over the query rows of a
// block of keys, one sums dQ over the keys of a block of queries. No atomics:
// each gradient element has one writer, so a run gives the same bits each
// time.
//
// Matrix products go through wmma 16×16×16 tiles (bf16 in, f32 accumulate,
// sm_80 on); everything elementwise is read from and written to shared
// memory in plain row-major tiles, never through a fragment's own element
// layout. Tensors are addressed by strides (batch, head, row; the last dim
// contiguous), so transposed views of q/k/v and the output need no copies.

#include <mma.h>

#include <type_traits>

#include "convert.cuh"

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800

using namespace nvcuda;

/// Element strides of a [batch, head, row, dim] view whose dim is contiguous.
struct Strides {
    long long b, h, i;
};

/// The attention's sizes: `heads` query heads over `kv_heads` key/value
/// heads, `t` queries after `s - t` earlier keys, `n_pads` entries in pads.
struct Sizes {
    int heads, kv_heads, t, s, n_pads;
    float scale;
};

__device__ __forceinline__ int first_key(const uint32_t *pads, const Sizes &z, int b) {
    return b < z.n_pads ? (int)pads[b] : 0;
}

// rows × HD elements of a [row, dim] view starting at row `first` into a
// dense tile, zeros past `limit` rows, by every thread of the block.
template <typename T, int HD>
__device__ __forceinline__ void load_rows(T *tile, int rows, const T *src, long long stride,
                                          int first, int limit) {
    for (int x = threadIdx.x; x < rows * HD; x += blockDim.x) {
        int r = x / HD, c = x % HD;
        tile[x] = first + r < limit ? src[(long long)(first + r) * stride + c] : from_f32<T>(0.f);
    }
}

template <typename T> using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using FragAt = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major>;
template <typename T> using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;
using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// The 16×16 block (row block rb, column block cb) of a · bᵀ for dense tiles
// a [.., K] and b [.., K] (both row-major, K columns), into `out` (ldo).
template <typename T, int K>
__device__ __forceinline__ void product_abt(float *out, int ldo, const T *a, const T *b, int rb,
                                            int cb) {
    Acc acc;
    wmma::fill_fragment(acc, 0.f);
    for (int kk = 0; kk < K / 16; ++kk) {
        FragA<T> fa;
        FragBt<T> fb;
        wmma::load_matrix_sync(fa, a + rb * 16 * K + kk * 16, K);
        wmma::load_matrix_sync(fb, b + cb * 16 * K + kk * 16, K);
        wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + rb * 16 * ldo + cb * 16, acc, ldo, wmma::mem_row_major);
}

// A warp's accumulator stored into `out` (global, [row, dim] with `stride`)
// as T, rows past `limit` left alone, through the warp's 256 floats of
// `stage`.
template <typename T>
__device__ __forceinline__ void store_acc(const Acc &acc, float *stage, T *out, long long stride,
                                          int row0, int col0, int limit) {
    int lane = threadIdx.x % 32;
    wmma::store_matrix_sync(stage, acc, 16, wmma::mem_row_major);
    __syncwarp();
    for (int x = lane; x < 256; x += 32) {
        int r = x / 16, c = x % 16;
        if (row0 + r < limit) out[(long long)(row0 + r) * stride + col0 + c] = from_f32<T>(stage[x]);
    }
    __syncwarp();
}

// Forward: a block takes 16·WARPS query rows of one (batch, head), each warp
// 16 of them, and walks the key tiles of BC keys that any of its rows sees.
// Lane pair (2r, 2r+1) of a warp owns row r: its running max and sum, and
// half of its columns in the elementwise steps.
template <typename T, int HD, int WARPS, int BC>
__device__ void flash_fwd(const T *q, const T *k, const T *v, T *o, float *lse,
                          const uint32_t *pads, Sizes z, Strides qs, Strides ks, Strides vs,
                          Strides os) {
    constexpr int BR = 16 * WARPS;
    __shared__ __align__(32) T q_tile[BR * HD];
    __shared__ __align__(32) T k_tile[BC * HD];
    __shared__ __align__(32) T v_tile[BC * HD];
    __shared__ __align__(32) float s_tile[WARPS][16 * BC];
    __shared__ __align__(32) T p_tile[WARPS][16 * BC];
    __shared__ __align__(32) float o_acc[WARPS][16 * HD];

    const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * BR;
    const int g = h / (z.heads / z.kv_heads);
    const int off = z.s - z.t;
    const int lo = first_key(pads, z, b);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int r = lane / 2, half = lane % 2;
    const int i = i0 + 16 * warp + r;
    const int hi = min(i + off, z.s - 1);  // the last key row i sees
    const T *kb = k + b * ks.b + g * ks.h;
    const T *vb = v + b * vs.b + g * vs.h;

    load_rows<T, HD>(q_tile, BR, q + b * qs.b + h * qs.h, qs.i, i0, z.t);
    for (int x = lane; x < 16 * HD; x += 32) o_acc[warp][x] = 0.f;
    float m = -INFINITY, l = 0.f;
    const int block_last = min(i0 + BR - 1 + off, z.s - 1);
    const int warp_last = min(i0 + 16 * warp + 15 + off, z.s - 1);
    for (int j0 = (lo / BC) * BC; j0 <= block_last; j0 += BC) {
        __syncthreads();  // every warp is done with the previous tile
        load_rows<T, HD>(k_tile, BC, kb, ks.i, j0, z.s);
        load_rows<T, HD>(v_tile, BC, vb, vs.i, j0, z.s);
        __syncthreads();
        if (j0 > warp_last) continue;  // causal: no row of this warp sees the tile
        for (int n = 0; n < BC / 16; ++n)
            product_abt<T, HD>(s_tile[warp], BC, q_tile + 16 * warp * HD, k_tile, 0, n);
        __syncwarp();

        // Online softmax over the tile for row r, columns [half·BC/2, +BC/2).
        const float *sr = s_tile[warp] + r * BC;
        T *pr = p_tile[warp] + r * BC;
        const int c0 = half * (BC / 2), c1 = c0 + BC / 2;
        float tile_max = -INFINITY;
        for (int c = c0; c < c1; ++c) {
            int j = j0 + c;
            if (i < z.t && j >= lo && j <= hi) tile_max = fmaxf(tile_max, sr[c] * z.scale);
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 1));
        const float m_new = fmaxf(m, tile_max);
        // m_new = -inf: nothing seen yet, the accumulator is still zero.
        const float alpha = m_new == -INFINITY ? 1.f : expf(m - m_new);
        float sum = 0.f;
        for (int c = c0; c < c1; ++c) {
            int j = j0 + c;
            float p = (i < z.t && j >= lo && j <= hi) ? expf(sr[c] * z.scale - m_new) : 0.f;
            sum += p;
            pr[c] = from_f32<T>(p);
        }
        sum += __shfl_xor_sync(0xffffffff, sum, 1);
        l = l * alpha + sum;
        m = m_new;
        float *orow = o_acc[warp] + r * HD;
        for (int c = half * (HD / 2); c < (half + 1) * (HD / 2); ++c) orow[c] *= alpha;
        __syncwarp();

        // o += p · v, the accumulator read from and written back to o_acc.
        for (int n = 0; n < HD / 16; ++n) {
            Acc acc;
            wmma::load_matrix_sync(acc, o_acc[warp] + n * 16, HD, wmma::mem_row_major);
            for (int kk = 0; kk < BC / 16; ++kk) {
                FragA<T> fa;
                FragB<T> fb;
                wmma::load_matrix_sync(fa, p_tile[warp] + kk * 16, BC);
                wmma::load_matrix_sync(fb, v_tile + kk * 16 * HD + n * 16, HD);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(o_acc[warp] + n * 16, acc, HD, wmma::mem_row_major);
        }
        __syncwarp();
    }
    if (i < z.t) {
        const float inv = l > 0.f ? 1.f / l : 0.f;
        T *orow = o + b * os.b + h * os.h + (long long)i * os.i;
        for (int c = half * (HD / 2); c < (half + 1) * (HD / 2); ++c)
            orow[c] = from_f32<T>(o_acc[warp][r * HD + c] * inv);
        if (half == 0) lse[((long long)b * z.heads + h) * z.t + i] = l > 0.f ? m + logf(l) : -INFINITY;
    }
}

// Δ_i = Σ_d dO_id · O_id per query row ([B, heads, t] f32): one warp a row.
template <typename T>
__device__ void flash_delta(const T *o, const T *dout, float *delta, int heads, int t, int hd,
                            Strides os, Strides ds) {
    const int b = blockIdx.z, h = blockIdx.y;
    const int i = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (i >= t) return;
    const T *orow = o + b * os.b + h * os.h + (long long)i * os.i;
    const T *drow = dout + b * ds.b + h * ds.h + (long long)i * ds.i;
    float acc = 0.f;
    for (int c = lane; c < hd; c += 32) acc += to_f32(orow[c]) * to_f32(drow[c]);
    for (int w = 16; w > 0; w >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, w);
    if (lane == 0) delta[((long long)b * heads + h) * t + i] = acc;
}

// The backward's two products of a [BQ, BK] tile, shared out over the
// block's warps a 16×16 block at a time: the scores q kᵀ and dP = dO vᵀ.
template <typename T, int HD, int WARPS, int BQ, int BK>
__device__ __forceinline__ void scores_and_dp(float *s_tile, float *dp_tile, const T *q_tile,
                                              const T *do_tile, const T *k_tile,
                                              const T *v_tile) {
    for (int f = threadIdx.x / 32; f < (BQ / 16) * (BK / 16); f += WARPS) {
        int rb = f / (BK / 16), cb = f % (BK / 16);
        product_abt<T, HD>(s_tile, BK, q_tile, k_tile, rb, cb);
        product_abt<T, HD>(dp_tile, BK, do_tile, v_tile, rb, cb);
    }
}

// P and dS of a [BQ, BK] tile from its scores and dP, by the whole block:
// p = exp(scale·s − lse_i) where row i sees key j (0 elsewhere), and
// dS = p (dP − Δ_i) · scale, both rounded to T for the products after.
template <typename T, int BQ, int BK>
__device__ __forceinline__ void probs_and_dscores(T *p_tile, T *ds_tile, const float *s_tile,
                                                  const float *dp_tile, const float *row_lse,
                                                  const float *row_delta, int i0, int j0,
                                                  int lo, const Sizes &z) {
    const int off = z.s - z.t;
    for (int x = threadIdx.x; x < BQ * BK; x += blockDim.x) {
        int r = x / BK, c = x % BK, i = i0 + r, j = j0 + c;
        bool seen = i < z.t && j < z.s && j >= lo && j <= i + off && row_lse[r] != -INFINITY;
        float p = seen ? expf(s_tile[x] * z.scale - row_lse[r]) : 0.f;
        if (p_tile) p_tile[x] = from_f32<T>(p);
        ds_tile[x] = from_f32<T>(p * (dp_tile[x] - row_delta[r]) * z.scale);
    }
}

// The rows' log-sum-exp and Δ of query rows i0 .. i0 + BQ into shared memory
// (-inf and 0 past t).
template <int BQ>
__device__ __forceinline__ void load_row_stats(float *row_lse, float *row_delta, const float *lse,
                                               const float *delta, long long base, int i0, int t) {
    for (int x = threadIdx.x; x < BQ; x += blockDim.x) {
        bool in = i0 + x < t;
        row_lse[x] = in ? lse[base + i0 + x] : -INFINITY;
        row_delta[x] = in ? delta[base + i0 + x] : 0.f;
    }
}

// dK and dV of BK keys: the sum over every query row, BQ rows at a time.
// Each warp keeps its share of the [BK, HD] accumulators in fragments for
// the whole walk. With O = T, a block takes one (batch, kv head) and sums
// over the query heads of its group in turn; with O = float (grouped heads:
// more blocks, a shorter walk each) one (batch, query head), writing that
// head's share at [b, h] of dk and dv for flash_sum_heads to add up.
template <typename T, typename O, int HD, int WARPS, int BQ, int BK>
__device__ void flash_dkdv(const T *q, const T *k, const T *v, const T *dout, const float *lse,
                           const float *delta, O *dk, O *dv, const uint32_t *pads, Sizes z,
                           Strides qs, Strides ks, Strides vs, Strides ds, Strides dks,
                           Strides dvs) {
    constexpr int PER_WARP = (BK / 16) * (HD / 16) / WARPS;
    static_assert(PER_WARP * WARPS == (BK / 16) * (HD / 16), "whole fragments per warp");
    __shared__ __align__(32) T k_tile[BK * HD];
    __shared__ __align__(32) T v_tile[BK * HD];
    __shared__ __align__(32) T q_tile[BQ * HD];
    __shared__ __align__(32) T do_tile[BQ * HD];
    __shared__ __align__(32) float s_tile[BQ * BK];
    __shared__ __align__(32) float dp_tile[BQ * BK];
    __shared__ __align__(32) T p_tile[BQ * BK];
    __shared__ __align__(32) T ds_tile[BQ * BK];
    __shared__ float row_lse[BQ], row_delta[BQ];
    static_assert(BQ * BK >= 256 * WARPS, "s_tile stages the stores");

    constexpr bool ONE_HEAD = !std::is_same<O, T>::value;
    const int b = blockIdx.z, j0 = blockIdx.x * BK;
    const int rep = z.heads / z.kv_heads, off = z.s - z.t;
    // The kv head whose keys the block reads, its query heads h_first ..
    // h_first + n_heads, and the head index its results go to.
    const int g = ONE_HEAD ? blockIdx.y / rep : blockIdx.y;
    const int h_first = ONE_HEAD ? blockIdx.y : g * rep, n_heads = ONE_HEAD ? 1 : rep;
    const int out_head = blockIdx.y;
    const int lo = first_key(pads, z, b);
    const int warp = threadIdx.x / 32;
    Acc dk_acc[PER_WARP], dv_acc[PER_WARP];
    for (int e = 0; e < PER_WARP; ++e) {
        wmma::fill_fragment(dk_acc[e], 0.f);
        wmma::fill_fragment(dv_acc[e], 0.f);
    }
    // Keys below the pad are seen by no row: their gradient stays zero.
    const bool seen = j0 + BK > lo;
    if (seen) {
        load_rows<T, HD>(k_tile, BK, k + b * ks.b + g * ks.h, ks.i, j0, z.s);
        load_rows<T, HD>(v_tile, BK, v + b * vs.b + g * vs.h, vs.i, j0, z.s);
    }
    // The first query row that sees key j0 is j0 - off.
    const int first = max(0, j0 - off) / BQ * BQ;
    for (int hr = 0; seen && hr < n_heads; ++hr) {
        const int h = h_first + hr;
        const long long base = ((long long)b * z.heads + h) * z.t;
        for (int i0 = first; i0 < z.t; i0 += BQ) {
            __syncthreads();  // the previous rows' tiles are used up
            load_rows<T, HD>(q_tile, BQ, q + b * qs.b + h * qs.h, qs.i, i0, z.t);
            load_rows<T, HD>(do_tile, BQ, dout + b * ds.b + h * ds.h, ds.i, i0, z.t);
            load_row_stats<BQ>(row_lse, row_delta, lse, delta, base, i0, z.t);
            __syncthreads();
            scores_and_dp<T, HD, WARPS, BQ, BK>(s_tile, dp_tile, q_tile, do_tile, k_tile, v_tile);
            __syncthreads();
            probs_and_dscores<T, BQ, BK>(p_tile, ds_tile, s_tile, dp_tile, row_lse, row_delta, i0,
                                         j0, lo, z);
            __syncthreads();
            // dV += Pᵀ dO and dK += dSᵀ Q: Pᵀ and dSᵀ read column-major.
            for (int e = 0; e < PER_WARP; ++e) {
                int f = warp * PER_WARP + e, kb = f / (HD / 16), cb = f % (HD / 16);
                for (int kk = 0; kk < BQ / 16; ++kk) {
                    FragAt<T> fa;
                    FragB<T> fb;
                    wmma::load_matrix_sync(fa, p_tile + kk * 16 * BK + kb * 16, BK);
                    wmma::load_matrix_sync(fb, do_tile + kk * 16 * HD + cb * 16, HD);
                    wmma::mma_sync(dv_acc[e], fa, fb, dv_acc[e]);
                    wmma::load_matrix_sync(fa, ds_tile + kk * 16 * BK + kb * 16, BK);
                    wmma::load_matrix_sync(fb, q_tile + kk * 16 * HD + cb * 16, HD);
                    wmma::mma_sync(dk_acc[e], fa, fb, dk_acc[e]);
                }
            }
        }
    }
    __syncthreads();  // s_tile is free to stage the stores
    float *stage = s_tile + 256 * warp;
    O *dkb = dk + b * dks.b + out_head * dks.h;
    O *dvb = dv + b * dvs.b + out_head * dvs.h;
    for (int e = 0; e < PER_WARP; ++e) {
        int f = warp * PER_WARP + e, kb = f / (HD / 16), cb = f % (HD / 16);
        store_acc<O>(dk_acc[e], stage, dkb, dks.i, j0 + kb * 16, cb * 16, z.s);
        store_acc<O>(dv_acc[e], stage, dvb, dvs.i, j0 + kb * 16, cb * 16, z.s);
    }
}

// dk and dv ([B, kv heads, s, hd] through their strides) as the sums of the
// per-query-head shares ([B, heads, s, hd] dense f32) of each group, added
// in head order; grid-strided over the B · kv heads · s · hd outputs.
template <typename T>
__device__ void flash_sum_heads(const float *dk_part, const float *dv_part, T *dk, T *dv, int b,
                                Sizes z, int hd, Strides dks, Strides dvs) {
    const int rep = z.heads / z.kv_heads;
    const long long n = (long long)b * z.kv_heads * z.s * hd;
    for (long long x = (long long)blockIdx.x * blockDim.x + threadIdx.x; x < n;
         x += (long long)gridDim.x * blockDim.x) {
        int c = x % hd, j = x / hd % z.s, g = x / hd / z.s % z.kv_heads;
        int bi = x / hd / z.s / z.kv_heads;
        float sk = 0.f, sv = 0.f;
        for (int r = 0; r < rep; ++r) {
            long long at = (((long long)bi * z.heads + g * rep + r) * z.s + j) * hd + c;
            sk += dk_part[at];
            sv += dv_part[at];
        }
        dk[bi * dks.b + g * dks.h + (long long)j * dks.i + c] = from_f32<T>(sk);
        dv[bi * dvs.b + g * dvs.h + (long long)j * dvs.i + c] = from_f32<T>(sv);
    }
}

// dQ of BQ query rows of one (batch, head): the sum over the key tiles the
// rows see. Each warp keeps its share of the [BQ, HD] accumulator.
template <typename T, int HD, int WARPS, int BQ, int BK>
__device__ void flash_dq(const T *q, const T *k, const T *v, const T *dout, const float *lse,
                         const float *delta, T *dq, const uint32_t *pads, Sizes z, Strides qs,
                         Strides ks, Strides vs, Strides ds, Strides dqs) {
    constexpr int PER_WARP = (BQ / 16) * (HD / 16) / WARPS;
    static_assert(PER_WARP * WARPS == (BQ / 16) * (HD / 16), "whole fragments per warp");
    __shared__ __align__(32) T q_tile[BQ * HD];
    __shared__ __align__(32) T do_tile[BQ * HD];
    __shared__ __align__(32) T k_tile[BK * HD];
    __shared__ __align__(32) T v_tile[BK * HD];
    __shared__ __align__(32) float s_tile[BQ * BK];
    __shared__ __align__(32) float dp_tile[BQ * BK];
    __shared__ __align__(32) T ds_tile[BQ * BK];
    __shared__ float row_lse[BQ], row_delta[BQ];
    static_assert(BQ * BK >= 256 * WARPS, "s_tile stages the stores");

    const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * BQ;
    const int g = h / (z.heads / z.kv_heads), off = z.s - z.t;
    const int lo = first_key(pads, z, b);
    const int warp = threadIdx.x / 32;
    Acc dq_acc[PER_WARP];
    for (int e = 0; e < PER_WARP; ++e) wmma::fill_fragment(dq_acc[e], 0.f);
    const long long base = ((long long)b * z.heads + h) * z.t;
    load_rows<T, HD>(q_tile, BQ, q + b * qs.b + h * qs.h, qs.i, i0, z.t);
    load_rows<T, HD>(do_tile, BQ, dout + b * ds.b + h * ds.h, ds.i, i0, z.t);
    load_row_stats<BQ>(row_lse, row_delta, lse, delta, base, i0, z.t);
    const T *kb = k + b * ks.b + g * ks.h;
    const T *vb = v + b * vs.b + g * vs.h;
    const int last = min(i0 + BQ - 1 + off, z.s - 1);
    for (int j0 = (lo / BK) * BK; j0 <= last; j0 += BK) {
        __syncthreads();  // the previous key tile is used up
        load_rows<T, HD>(k_tile, BK, kb, ks.i, j0, z.s);
        load_rows<T, HD>(v_tile, BK, vb, vs.i, j0, z.s);
        __syncthreads();
        scores_and_dp<T, HD, WARPS, BQ, BK>(s_tile, dp_tile, q_tile, do_tile, k_tile, v_tile);
        __syncthreads();
        probs_and_dscores<T, BQ, BK>(nullptr, ds_tile, s_tile, dp_tile, row_lse, row_delta, i0,
                                     j0, lo, z);
        __syncthreads();
        // dQ += dS K.
        for (int e = 0; e < PER_WARP; ++e) {
            int f = warp * PER_WARP + e, rb = f / (HD / 16), cb = f % (HD / 16);
            for (int kk = 0; kk < BK / 16; ++kk) {
                FragA<T> fa;
                FragB<T> fb;
                wmma::load_matrix_sync(fa, ds_tile + rb * 16 * BK + kk * 16, BK);
                wmma::load_matrix_sync(fb, k_tile + kk * 16 * HD + cb * 16, HD);
                wmma::mma_sync(dq_acc[e], fa, fb, dq_acc[e]);
            }
        }
    }
    __syncthreads();  // s_tile is free to stage the stores
    float *stage = s_tile + 256 * warp;
    T *dqb = dq + b * dqs.b + h * dqs.h;
    for (int e = 0; e < PER_WARP; ++e) {
        int f = warp * PER_WARP + e, rb = f / (HD / 16), cb = f % (HD / 16);
        store_acc<T>(dq_acc[e], stage, dqb, dqs.i, i0 + rb * 16, cb * 16, z.t);
    }
}

// Launch shapes (crate::flash_attention mirrors them): the forward takes
// 16·FWD_WARPS query rows a block (4 warps at head dim 64, 2 at 128, to stay
// within 48 KiB of static shared memory), the backward 32×32 tiles with 4
// warps (dkdv a block per kv head, dkdv_heads one per query head); the Δ
// kernel one warp a row, 4 rows a block; the head sum 256 threads a block.
#define FLASH(NAME, T, HD, FWD_WARPS)                                                              \
    extern "C" __global__ void flash_fwd_##NAME##_hd##HD(                                         \
        const T *q, const T *k, const T *v, T *o, float *lse, const uint32_t *pads, Sizes z,       \
        Strides qs, Strides ks, Strides vs, Strides os) {                                          \
        flash_fwd<T, HD, FWD_WARPS, 32>(q, k, v, o, lse, pads, z, qs, ks, vs, os);                 \
    }                                                                                              \
    extern "C" __global__ void flash_dkdv_##NAME##_hd##HD(                                        \
        const T *q, const T *k, const T *v, const T *dout, const float *lse, const float *delta,   \
        T *dk, T *dv, const uint32_t *pads, Sizes z, Strides qs, Strides ks, Strides vs,           \
        Strides ds, Strides dks, Strides dvs) {                                                    \
        flash_dkdv<T, T, HD, 4, 32, 32>(q, k, v, dout, lse, delta, dk, dv, pads, z, qs, ks, vs,    \
                                        ds, dks, dvs);                                             \
    }                                                                                              \
    extern "C" __global__ void flash_dkdv_heads_##NAME##_hd##HD(                                  \
        const T *q, const T *k, const T *v, const T *dout, const float *lse, const float *delta,   \
        float *dk, float *dv, const uint32_t *pads, Sizes z, Strides qs, Strides ks, Strides vs,   \
        Strides ds, Strides dks, Strides dvs) {                                                    \
        flash_dkdv<T, float, HD, 4, 32, 32>(q, k, v, dout, lse, delta, dk, dv, pads, z, qs, ks,    \
                                            vs, ds, dks, dvs);                                     \
    }                                                                                              \
    extern "C" __global__ void flash_dq_##NAME##_hd##HD(                                          \
        const T *q, const T *k, const T *v, const T *dout, const float *lse, const float *delta,   \
        T *dq, const uint32_t *pads, Sizes z, Strides qs, Strides ks, Strides vs, Strides ds,      \
        Strides dqs) {                                                                             \
        flash_dq<T, HD, 4, 32, 32>(q, k, v, dout, lse, delta, dq, pads, z, qs, ks, vs, ds, dqs);   \
    }

#define FLASH_DELTA(NAME, T)                                                                       \
    extern "C" __global__ void flash_delta_##NAME(const T *o, const T *dout, float *delta,        \
                                                  int heads, int t, int hd, Strides os,            \
                                                  Strides ds) {                                    \
        flash_delta<T>(o, dout, delta, heads, t, hd, os, ds);                                      \
    }                                                                                              \
    extern "C" __global__ void flash_sum_heads_##NAME(const float *dk_part, const float *dv_part,  \
                                                      T *dk, T *dv, int b, Sizes z, int hd,        \
                                                      Strides dks, Strides dvs) {                  \
        flash_sum_heads<T>(dk_part, dv_part, dk, dv, b, z, hd, dks, dvs);                          \
    }

FLASH(bf16, __nv_bfloat16, 64, 4)
FLASH(bf16, __nv_bfloat16, 128, 2)
FLASH_DELTA(bf16, __nv_bfloat16)

#endif
