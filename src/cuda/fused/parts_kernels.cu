// cuda/fused/parts_kernels.cu — the kernels of compound plans (parts_kernels.hpp).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/fused/parts_kernels.hpp"
#include "plan/merge.hpp"

namespace spattn::cuda::fused {
namespace {

template <class T>
struct Pack;
template <>
struct Pack<__nv_bfloat16> {
  static __device__ float2 unpack(uint32_t u) { return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&u)); }
  static __device__ uint32_t pack(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};
template <>
struct Pack<__half> {
  static __device__ float2 unpack(uint32_t u) { return __half22float2(*reinterpret_cast<__half2*>(&u)); }
  static __device__ uint32_t pack(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

// E consecutive elements (E / 8 16-byte words) to floats and back.
template <class T, int E>
__device__ void load_row(const void* p, float (&f)[E]) {
  const uint4* w = static_cast<const uint4*>(p);
#pragma unroll
  for (int i = 0; i < E / 8; ++i) {
    const uint4 u = __ldg(w + i);
    const uint32_t x[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 t = Pack<T>::unpack(x[j]);
      f[i * 8 + 2 * j] = t.x;
      f[i * 8 + 2 * j + 1] = t.y;
    }
  }
}
template <class T, int E>
__device__ void store_row(void* p, const float (&f)[E]) {
  uint4* w = static_cast<uint4*>(p);
#pragma unroll
  for (int i = 0; i < E / 8; ++i)
    w[i] = make_uint4(Pack<T>::pack(f[i * 8], f[i * 8 + 1]), Pack<T>::pack(f[i * 8 + 2], f[i * 8 + 3]),
                      Pack<T>::pack(f[i * 8 + 4], f[i * 8 + 5]), Pack<T>::pack(f[i * 8 + 6], f[i * 8 + 7]));
}

__device__ __forceinline__ float safe_max(float m) { return m == -INFINITY ? 0.f : m; }

constexpr int kWarps = 4;
constexpr float kLn2 = 0.6931471805599453f;

template <class T, int D>
__global__ void __launch_bounds__(kWarps * 32) scattered_kernel(ScatteredParams p) {
  constexpr int E = D / 8;
  const int64_t warp = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x & 31, g = lane >> 3, s = lane & 7;
  if (warp >= int64_t(p.batch) * p.q_len * p.q_heads) return;
  const int h = int(warp % p.q_heads);
  const int64_t bq = warp / p.q_heads;
  const int q = int(bq % p.q_len), b = int(bq / p.q_len), hk = h / p.group;
  constexpr int64_t es = sizeof(T);
  float qf[E];
  load_row<T, E>(static_cast<const char*>(p.q.data) + (b * p.q.sb + q * p.q.sl + h * p.q.sh + s * E) * es, qf);
#pragma unroll
  for (int e = 0; e < E; ++e) qf[e] *= p.scale_log2;
  const char* kbase = static_cast<const char*>(p.k.data) + (b * p.k.sb + hk * p.k.sh + s * E) * es;
  const char* vbase = static_cast<const char*>(p.v.data) + (b * p.v.sb + hk * p.v.sh + s * E) * es;
  float m = -INFINITY, l = 0.f, acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.f;
  const int64_t beg = p.offsets[q], end = p.offsets[q + 1];
  // Group g takes keys beg + g, beg + g + 4, ...; two of them an iteration (all four rows' loads in flight).
  for (int64_t i = beg + g; i < end; i += 8) {
    const bool two = i + 4 < end;
    const int64_t k0 = p.cols[i], k1 = two ? p.cols[i + 4] : k0;
    float kf0[E], kf1[E], vf0[E], vf1[E];
    load_row<T, E>(kbase + k0 * p.k.sl * es, kf0);
    load_row<T, E>(kbase + k1 * p.k.sl * es, kf1);
    load_row<T, E>(vbase + k0 * p.v.sl * es, vf0);
    load_row<T, E>(vbase + k1 * p.v.sl * es, vf1);
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) s0 = fmaf(qf[e], kf0[e], s0), s1 = fmaf(qf[e], kf1[e], s1);
#pragma unroll
    for (int off = 1; off < 8; off <<= 1) {
      s0 += __shfl_xor_sync(0xffffffffu, s0, off);
      s1 += __shfl_xor_sync(0xffffffffu, s1, off);
    }
    if (!two) s1 = -INFINITY;
    const float mn = fmaxf(m, fmaxf(s0, s1)), ms = safe_max(mn);
    const float corr = exp2f(m - ms), p0 = exp2f(s0 - ms), p1 = exp2f(s1 - ms);
    l = l * corr + p0 + p1;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = fmaf(p1, vf1[e], fmaf(p0, vf0[e], acc[e] * corr));
    m = mn;
  }
  // The four groups' partial rows, merged (every lane ends with the row).
#pragma unroll
  for (int off = 8; off < 32; off <<= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, off), l2 = __shfl_xor_sync(0xffffffffu, l, off);
    const float mn = fmaxf(m, m2), ms = safe_max(mn), c1 = exp2f(m - ms), c2 = exp2f(m2 - ms);
    l = l * c1 + l2 * c2;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = acc[e] * c1 + __shfl_xor_sync(0xffffffffu, acc[e], off) * c2;
    m = mn;
  }
  if (g != 0) return;
  const float lse_part = l == 0.f ? -INFINITY : (m + log2f(l)) * kLn2;  // NaN stays NaN
  float* lse = p.lse + b * p.lse_sb + h * p.lse_sh + q;
  char* orow = static_cast<char*>(p.o.data) + (b * p.o.sb + q * p.o.sl + h * p.o.sh + s * E) * es;
  const float inv = l == 0.f ? 0.f : 1.f / l;
  if (p.merge) {
    if (l == 0.f) return;  // nothing kept here: the row stays as the other parts left it
    float prev[E];
    load_row<T, E>(orow, prev);
    const float lse_prev = *lse;
    const plan::MergeWeights w = plan::merge_weights(lse_prev, lse_part);
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = w.wa * prev[e] + w.wb * acc[e] * inv;
    __syncwarp(0xffu);
    store_row<T, E>(orow, acc);
    if (s == 0) *lse = w.lse;
    return;
  }
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] *= inv;
  store_row<T, E>(orow, acc);
  if (s == 0) *lse = lse_part;
}

template <class T, int D>
int launch_scattered_t(const ScatteredParams& p, cudaStream_t st) {
  const int64_t rows = int64_t(p.batch) * p.q_len * p.q_heads;
  if (rows == 0) return 0;
  scattered_kernel<T, D><<<unsigned((rows + kWarps - 1) / kWarps), kWarps * 32, 0, st>>>(p);
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
  const uint4 a = *op, bb = __ldg(o2 + i);
  const uint32_t xa[4] = {a.x, a.y, a.z, a.w}, xb[4] = {bb.x, bb.y, bb.z, bb.w};
  uint32_t out[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 fa = Pack<T>::unpack(xa[j]), fb = Pack<T>::unpack(xb[j]);
    out[j] = w.wb == 0.f ? xa[j] : Pack<T>::pack(w.wa * fa.x + w.wb * fb.x, w.wa * fa.y + w.wb * fb.y);
  }
  *op = make_uint4(out[0], out[1], out[2], out[3]);
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
