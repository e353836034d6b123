// cuda/fused/parts_kernels.cu — the kernels of compound plans (parts_kernels.hpp).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/common/rows16.cuh"
#include "cuda/fused/parts_kernels.hpp"
#include "plan/merge.hpp"

namespace spattn::cuda::fused {
namespace {

using rows16::fetch;
using rows16::load_row;
using rows16::store_row;
using rows16::to_float;

__device__ __forceinline__ float safe_max(float m) { return m == -INFINITY ? 0.f : m; }

constexpr int kWarps = 4;
constexpr float kLn2 = 0.6931471805599453f;

// Four rows a warp (rows = flattened (b, h, q), queries fastest: the warps in flight read one head's K/V, which stays
// in L2, where heads fastest had every head's K/V in flight, more than L2 holds): group g = lane / 8 takes row
// 4 * warp + g, lane
// s = lane % 8 its elements [s * E, s * E + E). Two keys a step, software-pipelined: a step's K/V rows are in
// flight while the step before is computed, and its key indices one step earlier still (the loads are the cost:
// K/V rows gathered through L2). The trip count is the warp's longest row (the score shuffles need every lane); a
// slot past its row's end loads a valid row and scores -inf.
template <class T, int D>
__global__ void __launch_bounds__(kWarps * 32) scattered_kernel(ScatteredParams p) {
  constexpr int E = D / 8, W = E / 8;
  constexpr int64_t es = sizeof(T);
  const int lane = threadIdx.x & 31, g = lane >> 3, s = lane & 7;
  const int64_t nrows = int64_t(p.batch) * p.q_len * p.q_heads;
  const int64_t row = (int64_t(blockIdx.x) * kWarps + threadIdx.x / 32) * 4 + g;
  const bool live = row < nrows;
  const int64_t r = live ? row : 0;
  const int q = int(r % p.q_len);
  const int64_t bh = r / p.q_len;
  const int h = int(bh % p.q_heads), b = int(bh / p.q_heads), hk = h / p.group;
  const int64_t beg = live ? p.offsets[q] : 0;
  const int n = live ? int(p.offsets[q + 1] - beg) : 0;
  int nmax = n;
  nmax = max(nmax, __shfl_xor_sync(0xffffffffu, nmax, 8));
  nmax = max(nmax, __shfl_xor_sync(0xffffffffu, nmax, 16));
  if (nmax == 0 && p.merge) return;  // no row of this warp keeps a key here
  char* orow = static_cast<char*>(p.o.data) + (b * p.o.sb + q * p.o.sl + h * p.o.sh + s * E) * es;
  float* lse = p.lse + b * p.lse_sb + h * p.lse_sh + q;
  uint4 prev[W];  // merge: the other parts' row, fetched now, used at the end
  float lse_prev = -INFINITY;
  if (p.merge && n > 0) {
    fetch<W>(orow, prev);
    lse_prev = *lse;
  }
  float qf[E];
  load_row<T, E>(static_cast<const char*>(p.q.data) + (b * p.q.sb + q * p.q.sl + h * p.q.sh + s * E) * es, qf);
#pragma unroll
  for (int e = 0; e < E; ++e) qf[e] *= p.scale_log2;
  const char* kbase = static_cast<const char*>(p.k.data) + (b * p.k.sb + hk * p.k.sh + s * E) * es;
  const char* vbase = static_cast<const char*>(p.v.data) + (b * p.v.sb + hk * p.v.sh + s * E) * es;
  // A slot past the row's end loads the row's last key (scored -inf, weighed 0): not another key, whose NaN or
  // infinity in V would reach this row as 0 * NaN. A row with no key loads key 0 and writes O = 0 (below).
  auto key_at = [&](int j) -> int64_t { return n > 0 ? p.cols[beg + min(j, n - 1)] : 0; };
  const int steps = (nmax + 1) / 2;
  int64_t kn0 = key_at(0), kn1 = key_at(1);  // step 0's keys
  uint4 kc0[W], kc1[W], vc0[W], vc1[W];
  fetch<W>(kbase + kn0 * p.k.sl * es, kc0);
  fetch<W>(kbase + kn1 * p.k.sl * es, kc1);
  fetch<W>(vbase + kn0 * p.v.sl * es, vc0);
  fetch<W>(vbase + kn1 * p.v.sl * es, vc1);
  kn0 = key_at(2), kn1 = key_at(3);  // step 1's keys
  float m = -INFINITY, l = 0.f, acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.f;
  for (int t = 0; t < steps; ++t) {
    uint4 kx0[W], kx1[W], vx0[W], vx1[W];
    if (t + 1 < steps) {  // step t + 1 in flight, step t + 2's keys asked for
      fetch<W>(kbase + kn0 * p.k.sl * es, kx0);
      fetch<W>(kbase + kn1 * p.k.sl * es, kx1);
      fetch<W>(vbase + kn0 * p.v.sl * es, vx0);
      fetch<W>(vbase + kn1 * p.v.sl * es, vx1);
      kn0 = key_at(2 * t + 4), kn1 = key_at(2 * t + 5);
    }
    float kf0[E], kf1[E], vf0[E], vf1[E];
    to_float<T, W>(kc0, kf0);
    to_float<T, W>(kc1, kf1);
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) s0 = fmaf(qf[e], kf0[e], s0), s1 = fmaf(qf[e], kf1[e], s1);
#pragma unroll
    for (int off = 1; off < 8; off <<= 1) {
      s0 += __shfl_xor_sync(0xffffffffu, s0, off);
      s1 += __shfl_xor_sync(0xffffffffu, s1, off);
    }
    if (2 * t >= n) s0 = -INFINITY;
    if (2 * t + 1 >= n) s1 = -INFINITY;
    const float mn = fmaxf(m, fmaxf(s0, s1)), ms = safe_max(mn);
    const float corr = exp2f(m - ms), p0 = exp2f(s0 - ms), p1 = exp2f(s1 - ms);
    l = l * corr + p0 + p1;
    to_float<T, W>(vc0, vf0);
    to_float<T, W>(vc1, vf1);
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = fmaf(p1, vf1[e], fmaf(p0, vf0[e], acc[e] * corr));
    m = mn;
#pragma unroll
    for (int i = 0; i < W; ++i) kc0[i] = kx0[i], kc1[i] = kx1[i], vc0[i] = vx0[i], vc1[i] = vx1[i];
  }
  if (!live) return;
  const float lse_part = l == 0.f ? -INFINITY : (m + log2f(l)) * kLn2;  // NaN stays NaN
  const float inv = l == 0.f ? 0.f : 1.f / l;
  if (p.merge) {
    if (n == 0) return;  // nothing kept here: the row stays as the other parts left it
    float pf[E];
    to_float<T, W>(prev, pf);
    const plan::MergeWeights w = plan::merge_weights(lse_prev, lse_part);
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = w.wa * pf[e] + w.wb * acc[e] * inv;
    store_row<T, E>(orow, acc);
    if (s == 0) *lse = w.lse;
    return;
  }
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = n == 0 ? 0.f : acc[e] * inv;  // no key: 0, not 0 * (key 0's V)
  store_row<T, E>(orow, acc);
  if (s == 0) *lse = lse_part;
}

template <class T, int D>
int launch_scattered_t(const ScatteredParams& p, cudaStream_t st) {
  const int64_t rows = int64_t(p.batch) * p.q_len * p.q_heads;
  if (rows == 0) return 0;
  const int64_t warps = (rows + 3) / 4;
  scattered_kernel<T, D><<<unsigned((warps + kWarps - 1) / kWarps), kWarps * 32, 0, st>>>(p);
  return int(cudaGetLastError());
}

__global__ void gather_keys_kernel(RowTensor src, uint4* dst, const int32_t* keys, int batch, int nkeys, int heads,
                                   int words) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(batch) * nkeys * heads * words) return;
  const int c = int(i % words);
  const int64_t r = i / words;
  const int h = int(r % heads);
  const int64_t bj = r / heads;
  const int j = int(bj % nkeys), b = int(bj / nkeys);
  const char* row = static_cast<const char*>(src.data) + (b * src.sb + int64_t(keys[j]) * src.sl + h * src.sh) * 2;
  dst[i] = __ldg(reinterpret_cast<const uint4*>(row) + c);
}

template <class T>
__global__ void merge_kernel(RowTensor o, float* lse, int64_t lse_sb, int64_t lse_sh, const uint4* o2,
                             const float* lse2, int batch, int q_len, int q_heads, int words) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool live = i < int64_t(batch) * q_len * q_heads * words;
  int c = 0, h = 0, q = 0, b = 0;
  if (live) {
    c = int(i % words);
    const int64_t r = i / words;
    h = int(r % q_heads);
    const int64_t bq = r / q_heads;
    q = int(bq % q_len), b = int(bq / q_len);
  }
  float* lp = lse + b * lse_sb + h * lse_sh + q;
  plan::MergeWeights w{};
  if (live) w = plan::merge_weights(*lp, lse2[(int64_t(b) * q_heads + h) * q_len + q]);
  __syncwarp();  // every lane of a row has read its lse before one writes it (a row's words share a warp)
  if (!live) return;
  uint4* op = reinterpret_cast<uint4*>(static_cast<char*>(o.data) + (b * o.sb + q * o.sl + h * o.sh) * 2) + c;
  if (w.wb != 0.f) {  // else the row keeps what it holds
    const uint4 wa[1] = {*op}, wb[1] = {__ldg(o2 + i)};
    float fa[8], fb[8];
    to_float<T, 1>(wa, fa);
    to_float<T, 1>(wb, fb);
#pragma unroll
    for (int j = 0; j < 8; ++j) fa[j] = w.wa * fa[j] + w.wb * fb[j];
    store_row<T, 8>(op, fa);
  }
  if (c == 0) *lp = w.lse;
}

}  // namespace

int launch_scattered(const ScatteredParams& p, void* stream) {
  const auto st = static_cast<cudaStream_t>(stream);
  if (p.head_dim == 64) return p.bf16 ? launch_scattered_t<__nv_bfloat16, 64>(p, st) : launch_scattered_t<__half, 64>(p, st);
  if (p.head_dim == 128)
    return p.bf16 ? launch_scattered_t<__nv_bfloat16, 128>(p, st) : launch_scattered_t<__half, 128>(p, st);
  return int(cudaErrorInvalidConfiguration);
}

int launch_gather_keys(const RowTensor& src, void* dst, const int32_t* keys, int batch, int nkeys, int heads,
                       int head_dim, void* stream) {
  const int words = head_dim / 8;
  const int64_t n = int64_t(batch) * nkeys * heads * words;
  if (n == 0) return 0;
  gather_keys_kernel<<<unsigned((n + 255) / 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      src, static_cast<uint4*>(dst), keys, batch, nkeys, heads, words);
  return int(cudaGetLastError());
}

int launch_merge(const RowTensor& o, float* lse, int64_t lse_sb, int64_t lse_sh, const void* o2, const float* lse2,
                 int batch, int q_len, int q_heads, int head_dim, bool bf16, void* stream) {
  const int words = head_dim / 8;
  const int64_t n = int64_t(batch) * q_len * q_heads * words;
  if (n == 0) return 0;
  const auto st = static_cast<cudaStream_t>(stream);
  const unsigned grid = unsigned((n + 255) / 256);
  const auto* w2 = static_cast<const uint4*>(o2);
  if (bf16)
    merge_kernel<__nv_bfloat16><<<grid, 256, 0, st>>>(o, lse, lse_sb, lse_sh, w2, lse2, batch, q_len, q_heads, words);
  else
    merge_kernel<__half><<<grid, 256, 0, st>>>(o, lse, lse_sb, lse_sh, w2, lse2, batch, q_len, q_heads, words);
  return int(cudaGetLastError());
}

}  // namespace spattn::cuda::fused
