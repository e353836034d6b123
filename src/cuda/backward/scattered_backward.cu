// cuda/backward/scattered_backward.cu — see scattered_backward.hpp.
#include <cuda_runtime.h>

#include "cuda/backward/scattered_backward.hpp"
#include "cuda/common/rows16.cuh"

namespace spattn::cuda {
namespace {

using rows16::fetch;
using rows16::load_row;
using rows16::store_row;
using rows16::to_float;

constexpr int kWarps = 4;  // a CTA
constexpr float kLog2e = 1.4426950408889634f;

// Sums over the eight lanes of a row (the whole warp takes part).
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
  for (int off = 1; off < 8; off <<= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}
// The largest of the warp's four rows' counts.
__device__ __forceinline__ int warp_max(int n) {
  n = max(n, __shfl_xor_sync(0xffffffffu, n, 8));
  return max(n, __shfl_xor_sync(0xffffffffu, n, 16));
}

template <class T>
__device__ __forceinline__ char* row_ptr(const ScatteredBwdParams::Rows& r, int64_t b, int64_t l, int64_t h, int e0) {
  return const_cast<char*>(static_cast<const char*>(r.data)) + (b * r.sb + l * r.sl + h * r.sh + e0) * int64_t(sizeof(T));
}

// Writes f (accumulate: adds it to the row's contents).
template <class T, int E>
__device__ __forceinline__ void put_row(char* p, float (&f)[E], int accumulate) {
  if (accumulate) {
    float old[E];
    load_row<T, E>(p, old);
#pragma unroll
    for (int e = 0; e < E; ++e) f[e] += old[e];
  }
  store_row<T, E>(p, f);
}

// A step of two entries: the gathered rows a (K or Q) and c (V or dO) of each.
template <int W>
struct Step {
  uint4 a0[W], a1[W], c0[W], c1[W];
};
// A step's rows as floats and their row sums s = x.a, d = y.c (x: the scaled Q or K row, y: dO or V).
template <int W>
struct Floats {
  float a0[W * 8], a1[W * 8], c0[W * 8], c1[W * 8];
  float s0, s1, d0, d1;
};
template <class T, int W>
__device__ __forceinline__ void step_sums(const Step<W>& st, const float (&x)[W * 8], const float (&y)[W * 8],
                                          Floats<W>& f) {
  to_float<T, W>(st.a0, f.a0);
  to_float<T, W>(st.a1, f.a1);
  to_float<T, W>(st.c0, f.c0);
  to_float<T, W>(st.c1, f.c1);
  float s0 = 0.f, s1 = 0.f, d0 = 0.f, d1 = 0.f;
#pragma unroll
  for (int e = 0; e < W * 8; ++e) {
    s0 = fmaf(x[e], f.a0[e], s0), s1 = fmaf(x[e], f.a1[e], s1);
    d0 = fmaf(y[e], f.c0[e], d0), d1 = fmaf(y[e], f.c1[e], d1);
  }
  f.s0 = row_sum(s0), f.s1 = row_sum(s1), f.d0 = row_sum(d0), f.d1 = row_sum(d1);
}

// dQ pass: a row (b, h, q) a group of eight lanes (lane s: elements [s E, s E + E)), four rows a warp; rows flattened
// queries fastest. Two keys a step, their K/V rows in flight while the step before is computed and their indices
// one step earlier still. The trip count is the warp's longest row (the shuffles need every lane): a slot past its
// row's end loads the row's last key and adds nothing (not 0 times it: a NaN there would reach this row).
template <class T, int D>
__global__ void __launch_bounds__(kWarps * 32) dq_rows_kernel(ScatteredBwdParams p) {
  constexpr int E = D / 8, W = E / 8;
  const int lane = threadIdx.x & 31, s = lane & 7;
  const int64_t nrows = int64_t(p.batch) * p.q_heads * p.q_len;
  const int64_t row = (int64_t(blockIdx.x) * kWarps + threadIdx.x / 32) * 4 + (lane >> 3);
  const bool live = row < nrows;
  const int64_t r = live ? row : 0;
  const int q = int(r % p.q_len);
  const int64_t bh = r / p.q_len;
  const int h = int(bh % p.q_heads), b = int(bh / p.q_heads), hk = h / p.group;
  const int64_t beg = live ? p.row_off[q] : 0;
  const int n = live ? int(p.row_off[q + 1] - beg) : 0;
  const int nmax = warp_max(n);
  if (nmax == 0 && p.accumulate) return;  // nothing to add on this warp's rows (and no key reads their delta)
  float qf[E], dof[E], of[E];
  load_row<T, E>(row_ptr<T>(p.q, b, q, h, s * E), qf);
  load_row<T, E>(row_ptr<T>(p.dout, b, q, h, s * E), dof);
  load_row<T, E>(row_ptr<T>(p.o, b, q, h, s * E), of);
  float delta = 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e) delta = fmaf(dof[e], of[e], delta);
  delta = row_sum(delta);
  if (live && s == 0) p.delta[b * p.delta_sb + h * p.delta_sh + q] = delta;
  const float lse2 = live ? p.lse[b * p.lse_sb + h * p.lse_sh + q] * kLog2e : 0.f;
  const float scale_log2 = p.scale * kLog2e;
#pragma unroll
  for (int e = 0; e < E; ++e) qf[e] *= scale_log2;
  const char* kbase = row_ptr<T>(p.k, b, 0, hk, s * E);
  const char* vbase = row_ptr<T>(p.v, b, 0, hk, s * E);
  const int64_t ksl = p.k.sl * int64_t(sizeof(T)), vsl = p.v.sl * int64_t(sizeof(T));
  auto key_at = [&](int j) -> int64_t { return n > 0 ? p.cols[beg + min(j, n - 1)] : 0; };
  auto issue = [&](Step<W>& st, int64_t j0, int64_t j1) {
    fetch<W>(kbase + j0 * ksl, st.a0);
    fetch<W>(kbase + j1 * ksl, st.a1);
    fetch<W>(vbase + j0 * vsl, st.c0);
    fetch<W>(vbase + j1 * vsl, st.c1);
  };
  const int steps = (nmax + 1) / 2;
  Step<W> cur;
  if (steps > 0) issue(cur, key_at(0), key_at(1));  // (none: no key may exist to load)
  int64_t kn0 = key_at(2), kn1 = key_at(3);
  float acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.f;
  for (int t = 0; t < steps; ++t) {
    Step<W> next;
    if (t + 1 < steps) {
      issue(next, kn0, kn1);
      kn0 = key_at(2 * t + 4), kn1 = key_at(2 * t + 5);
    }
    Floats<W> f;  // K rows in a, V rows in c
    step_sums<T, W>(cur, qf, dof, f);
    const float ds0 = exp2f(f.s0 - lse2) * (f.d0 - delta), ds1 = exp2f(f.s1 - lse2) * (f.d1 - delta);
    if (2 * t < n) {
#pragma unroll
      for (int e = 0; e < E; ++e) acc[e] = fmaf(ds0, f.a0[e], acc[e]);
    }
    if (2 * t + 1 < n) {
#pragma unroll
      for (int e = 0; e < E; ++e) acc[e] = fmaf(ds1, f.a1[e], acc[e]);
    }
    if (t + 1 < steps) cur = next;
  }
  if (!live || (n == 0 && p.accumulate)) return;
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] *= p.scale;
  put_row<T, E>(row_ptr<T>(p.dq, b, q, h, s * E), acc, p.accumulate);
}

// dK/dV pass: a key (b, kv head, j) a group of eight lanes, four keys a warp, keys fastest (in key_order where given);
// its entries are the
// queries that keep it (transposed CSR) for each query head of its group, two a step, pipelined as above (Q and dO
// rows, lse and delta).
template <class T, int D>
__global__ void __launch_bounds__(kWarps * 32) dkv_rows_kernel(ScatteredBwdParams p) {
  constexpr int E = D / 8, W = E / 8;
  const int lane = threadIdx.x & 31, s = lane & 7;
  const int kv_heads = p.q_heads / p.group;
  const int64_t nkeys = int64_t(p.batch) * kv_heads * p.k_len;
  const int64_t key = (int64_t(blockIdx.x) * kWarps + threadIdx.x / 32) * 4 + (lane >> 3);
  const bool live = key < nkeys;
  const int64_t r = live ? key : 0;
  const int j = p.key_order ? p.key_order[r % p.k_len] : int(r % p.k_len);
  const int64_t bh = r / p.k_len;
  const int hk = int(bh % kv_heads), b = int(bh / kv_heads);
  const int64_t beg = live ? p.col_off[j] : 0;
  const int cnt = live ? int(p.col_off[j + 1] - beg) : 0;
  const int n = cnt * p.group;  // entries: (head hk group + t / cnt, query rows[beg + t % cnt])
  const int nmax = warp_max(n);
  if (nmax == 0 && p.accumulate) return;
  float kf[E], vf[E];
  load_row<T, E>(row_ptr<T>(p.k, b, j, hk, s * E), kf);
  load_row<T, E>(row_ptr<T>(p.v, b, j, hk, s * E), vf);
  const float scale_log2 = p.scale * kLog2e;
#pragma unroll
  for (int e = 0; e < E; ++e) kf[e] *= scale_log2;
  // Entry t's query head and row (t clamped to the last entry; none: head hk group, row 0, adding nothing).
  auto entry_at = [&](int t, int* h) -> int64_t {
    if (n == 0) {
      *h = hk * p.group;
      return 0;
    }
    t = min(t, n - 1);
    const int g = t / cnt;
    *h = hk * p.group + g;
    return p.rows[beg + (t - g * cnt)];
  };
  const int64_t qsl = p.q.sl * int64_t(sizeof(T)), dsl = p.dout.sl * int64_t(sizeof(T));
  const int64_t qsh = p.q.sh * int64_t(sizeof(T)), dsh = p.dout.sh * int64_t(sizeof(T));
  const char* qbase = row_ptr<T>(p.q, b, 0, 0, s * E);
  const char* dbase = row_ptr<T>(p.dout, b, 0, 0, s * E);
  const float* lse = p.lse + b * p.lse_sb;
  const float* dlt = p.delta + b * p.delta_sb;
  struct Idx {
    int64_t i0, i1;
    int h0, h1;
  };
  auto idx_at = [&](int t) {
    Idx x;
    x.i0 = entry_at(t, &x.h0);
    x.i1 = entry_at(t + 1, &x.h1);
    return x;
  };
  struct Stats {
    float lse0, lse1, dl0, dl1;
  };
  auto issue = [&](Step<W>& st, Stats& m, const Idx& x) {
    fetch<W>(qbase + x.i0 * qsl + x.h0 * qsh, st.a0);
    fetch<W>(qbase + x.i1 * qsl + x.h1 * qsh, st.a1);
    fetch<W>(dbase + x.i0 * dsl + x.h0 * dsh, st.c0);
    fetch<W>(dbase + x.i1 * dsl + x.h1 * dsh, st.c1);
    m.lse0 = __ldg(lse + x.h0 * p.lse_sh + x.i0), m.lse1 = __ldg(lse + x.h1 * p.lse_sh + x.i1);
    m.dl0 = dlt[x.h0 * p.delta_sh + x.i0], m.dl1 = dlt[x.h1 * p.delta_sh + x.i1];
  };
  const int steps = (nmax + 1) / 2;
  Step<W> cur;
  Stats cm;
  if (steps > 0) issue(cur, cm, idx_at(0));
  Idx nx = idx_at(2);
  float gk[E], gv[E];
#pragma unroll
  for (int e = 0; e < E; ++e) gk[e] = 0.f, gv[e] = 0.f;
  for (int t = 0; t < steps; ++t) {
    Step<W> next;
    Stats nm;
    if (t + 1 < steps) {
      issue(next, nm, nx);
      nx = idx_at(2 * t + 4);
    }
    Floats<W> f;  // Q rows in a, dO rows in c
    step_sums<T, W>(cur, kf, vf, f);
    const float p0 = exp2f(f.s0 - cm.lse0 * kLog2e), p1 = exp2f(f.s1 - cm.lse1 * kLog2e);
    const float ds0 = p0 * (f.d0 - cm.dl0), ds1 = p1 * (f.d1 - cm.dl1);
    if (2 * t < n) {
#pragma unroll
      for (int e = 0; e < E; ++e) gk[e] = fmaf(ds0, f.a0[e], gk[e]), gv[e] = fmaf(p0, f.c0[e], gv[e]);
    }
    if (2 * t + 1 < n) {
#pragma unroll
      for (int e = 0; e < E; ++e) gk[e] = fmaf(ds1, f.a1[e], gk[e]), gv[e] = fmaf(p1, f.c1[e], gv[e]);
    }
    if (t + 1 < steps) cur = next, cm = nm;
  }
  if (!live || (n == 0 && p.accumulate)) return;
#pragma unroll
  for (int e = 0; e < E; ++e) gk[e] *= p.scale;
  put_row<T, E>(row_ptr<T>(p.dk, b, j, hk, s * E), gk, p.accumulate);
  put_row<T, E>(row_ptr<T>(p.dv, b, j, hk, s * E), gv, p.accumulate);
}

template <class T, int D>
int launch_t(const ScatteredBwdParams& p, cudaStream_t st) {
  const int64_t rows = int64_t(p.batch) * p.q_heads * p.q_len;
  const int64_t keys = int64_t(p.batch) * (p.q_heads / p.group) * p.k_len;
  auto ctas = [](int64_t n) { return unsigned(((n + 3) / 4 + kWarps - 1) / kWarps); };
  if (rows > 0) dq_rows_kernel<T, D><<<ctas(rows), kWarps * 32, 0, st>>>(p);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return int(e);
  if (keys > 0) dkv_rows_kernel<T, D><<<ctas(keys), kWarps * 32, 0, st>>>(p);
  return int(cudaGetLastError());
}

}  // namespace

bool scattered_backward_takes(const ScatteredBwdParams& p) {
  if (p.head_dim != 64 && p.head_dim != 128) return false;
  const ScatteredBwdParams::Rows* all[] = {&p.q, &p.k, &p.v, &p.o, &p.dout, &p.dq, &p.dk, &p.dv};
  for (const auto* t : all)
    if (reinterpret_cast<uintptr_t>(t->data) % 16 || t->sb % 8 || t->sl % 8 || t->sh % 8) return false;
  return p.group >= 1 && p.q_heads % p.group == 0;
}

int launch_scattered_backward(const ScatteredBwdParams& p, void* stream) {
  if (!scattered_backward_takes(p)) return int(cudaErrorInvalidValue);
  const auto st = static_cast<cudaStream_t>(stream);
  if (p.head_dim == 64) return p.bf16 ? launch_t<__nv_bfloat16, 64>(p, st) : launch_t<__half, 64>(p, st);
  return p.bf16 ? launch_t<__nv_bfloat16, 128>(p, st) : launch_t<__half, 128>(p, st);
}

}  // namespace spattn::cuda
