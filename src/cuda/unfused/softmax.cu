// Compound sparse softmax: one row is the row r of every coarse block of its block row (BSR, with masks)
// plus the row's fine CSR entries; scaling and masking fused, P and the row LSE written.
//
// With a coarse part (bf16/f16, 16-byte aligned S/P): one CTA per (block row, b*h), BS*BS/8 threads; a
// block row's S is one contiguous array (its blocks are adjacent in BSR order), so thread t takes row
// t/(BS/8) and 16 bytes (8 columns) of it in every block: each block is read as one coalesced 2 or 8 KB
// sweep of 16-byte loads, and a row's max/sum is reduced over the BS/8 lanes of a quad/octet (no shared
// memory, no barrier). The first NREG blocks of the row are held in registers (8 packed halves each) between
// the pass that finds max/sum and the pass that writes P, so S is read once there; longer rows (global
// rows, causal) stream the rest in groups of 8 and read it again in the second pass.
//   Bytes, H100, na2d (block 32, ~14 coarse blocks a block row, 32 heads): S 117 MB read + P 117 MB
//   written ~ 0.08 ms at ~3 TB/s, against 0.30 ms for the warp-per-row kernel below (2-byte loads per
//   lane and dependent metadata loads per block per lane: latency bound).
// Without a coarse part (fine only, or f32): one warp per (row, b, h), below.
// Rows past Lq inside the last block row get P = 0, so the coarse P array is fully written.
#include <math_constants.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/common/check.hpp"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/unfused/checks.hpp"
#include "cuda/unfused/dtype.cuh"

namespace spattn::unfused::detail {
using namespace ::spattn::cuda::ptx;
namespace {

// Each lane owns BS/32 adjacent columns of every block (a float2 for 64-blocks); blocks are taken 8 at a
// time with all loads issued first (a warp-per-row loop that loads, then uses, is latency bound: the first
// version, one float per lane and per-element online rescaling, ran local(256) at 0.68 ms on an H100).
// Each chunk finds its max first, so there is one exp2 per element.
template <class T, int BS>
__global__ void __launch_bounds__(256) softmax_kernel(const CompoundSoftmax::Arguments a, int64_t rows) {
  constexpr int EPL = BS / 32, CH = 8;
  const int64_t q = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  if (q >= rows) return;
  const int64_t bh = blockIdx.y;
  const int lane = threadIdx.x % 32, c0 = lane * EPL;
  const bool valid = q < a.shape.Lq;
  const float sl2 = a.scale * 1.4426950408889634f;  // scale * log2(e)
  constexpr int64_t bb = int64_t(BS) * BS, wpm = bb / 64;

  int64_t cfirst = 0, clast = 0, r = 0;
  if (a.coarse.nblocks > 0) {
    const int64_t br = q / BS;
    r = q % BS;
    cfirst = a.coarse.row_offsets[br];
    clast = a.coarse.row_offsets[br + 1];
  }
  int64_t ffirst = 0, flast = 0;
  if (valid && a.fine.nnz > 0) {
    ffirst = a.fine.row_offsets[q];
    flast = a.fine.row_offsets[q + 1];
  }
  const T* Sc = static_cast<const T*>(a.s_coarse) + bh * a.coarse.nblocks * bb + r * BS + c0;
  const T* Sf = static_cast<const T*>(a.s_fine) + bh * a.fine.nnz;

  // The kept bits of this lane's EPL columns in block blk (this row): mask bit and in range.
  auto lane_bits = [&](int64_t blk) -> unsigned {
    if (!valid) return 0u;
    const int64_t mi = a.coarse.mask_index[blk];
    unsigned bits = (1u << EPL) - 1;
    if (mi >= 0) {
      const int64_t bit = r * BS + c0;
      bits = unsigned(a.coarse.masks[mi * wpm + bit / 64] >> (bit % 64)) & ((1u << EPL) - 1);
    }
    const int64_t rem = a.shape.Lk - (int64_t(a.coarse.cols[blk]) * BS + c0);
    if (rem < EPL) bits &= rem <= 0 ? 0u : ((1u << rem) - 1);
    return bits;
  };
  auto load = [&](int64_t blk, float (&v)[EPL]) {
#pragma unroll
    for (int e = 0; e < EPL; ++e) v[e] = Num<T>::to(Sc[blk * bb + e]);  // adjacent: one 4- or 8-byte load
  };

  float m = -CUDART_INF_F, l = 0.f;
  // Chunk maxima propagate NaN (max_nan): a chunk holding a kept NaN (a NaN or +inf - +inf score) makes l NaN, so
  // the row's LSE and P are NaN (fmaxf would skip it, and a chunk of NaNs alone would look empty).
  auto absorb = [&](float mx, auto&& sum_with) {  // a chunk with max mx (scaled, log2 domain)
    if (mx != mx) {
      l = CUDART_NAN_F;
      return;
    }
    if (mx == -CUDART_INF_F) return;
    if (mx > m) {
      l *= exp2f(m - mx);
      m = mx;
    }
    l += sum_with(m);
  };
  if (valid) {
    for (int64_t blk0 = cfirst; blk0 < clast; blk0 += CH) {
      float v[CH][EPL];
      unsigned kb[CH];
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        kb[i] = blk0 + i < clast ? lane_bits(blk0 + i) : 0u;
        if (blk0 + i < clast) load(blk0 + i, v[i]);
      }
      float mx = -CUDART_INF_F;
#pragma unroll
      for (int i = 0; i < CH; ++i)
#pragma unroll
        for (int e = 0; e < EPL; ++e) {
          v[i][e] *= sl2;
          if ((kb[i] >> e) & 1) mx = max_nan(mx, v[i][e]);
        }
      absorb(mx, [&](float mm) {
        float t = 0.f;
#pragma unroll
        for (int i = 0; i < CH; ++i)
#pragma unroll
          for (int e = 0; e < EPL; ++e)
            if ((kb[i] >> e) & 1) t += exp2f(v[i][e] - mm);
        return t;
      });
    }
    for (int64_t i0 = ffirst; i0 < flast; i0 += 32 * CH) {
      float v[CH];
      float mx = -CUDART_INF_F;
#pragma unroll
      for (int j = 0; j < CH; ++j) {
        const int64_t i = i0 + j * 32 + lane;
        v[j] = i < flast ? Num<T>::to(Sf[i]) * sl2 : -CUDART_INF_F;
        mx = max_nan(mx, v[j]);
      }
      absorb(mx, [&](float mm) {
        float t = 0.f;
#pragma unroll
        for (int j = 0; j < CH; ++j) t += exp2f(v[j] - mm);  // exp2(-inf) = 0 for the tail
        return t;
      });
    }
  }
  float M = m;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  float L = M == -CUDART_INF_F ? l : l * exp2f(m - M);  // M = -inf: every l is 0 or NaN
#pragma unroll
  for (int o = 16; o > 0; o /= 2) L += __shfl_xor_sync(0xffffffffu, L, o);
  const float lse2 = L == 0.f ? -CUDART_INF_F : M + log2f(L);  // log2 of the row's sum of 2^(x * scale * log2 e); NaN stays

  if (valid && lane == 0 && a.lse2) a.lse2[bh * a.shape.Lq + q] = lse2 == -CUDART_INF_F ? CUDART_INF_F : lse2;
  if (valid && lane == 0 && a.lse) a.lse[bh * a.shape.Lq + q] = lse2 == -CUDART_INF_F ? lse2 : lse2 * 0.6931471805599453f;
  if (!a.p_coarse && !a.p_fine) return;  // LSE only
  T* Pc = static_cast<T*>(a.p_coarse) + bh * a.coarse.nblocks * bb + r * BS + c0;
  for (int64_t blk0 = cfirst; blk0 < clast; blk0 += CH) {
    float v[CH][EPL];
    unsigned kb[CH];
#pragma unroll
    for (int i = 0; i < CH; ++i) {
      kb[i] = blk0 + i < clast ? lane_bits(blk0 + i) : 0u;
      if (kb[i]) load(blk0 + i, v[i]);
    }
#pragma unroll
    for (int i = 0; i < CH; ++i) {
      if (blk0 + i >= clast) break;
      T out[EPL];
#pragma unroll
      for (int e = 0; e < EPL; ++e) out[e] = Num<T>::from((kb[i] >> e) & 1 ? exp2f(v[i][e] * sl2 - lse2) : 0.f);
      if constexpr (EPL == 2 && sizeof(T) == 2) {
        *reinterpret_cast<uint32_t*>(Pc + (blk0 + i) * bb) = *reinterpret_cast<uint32_t*>(out);
      } else {
#pragma unroll
        for (int e = 0; e < EPL; ++e) Pc[(blk0 + i) * bb + e] = out[e];
      }
    }
  }
  T* Pf = static_cast<T*>(a.p_fine) + bh * a.fine.nnz;
  for (int64_t i = ffirst + lane; i < flast; i += 32) Pf[i] = Num<T>::from(exp2f(Num<T>::to(Sf[i]) * sl2 - lse2));
}

// One CTA per (block row, b*h): see the header. Thread t: row t / G of the block row, columns
// 8 (t % G) .. +7 of every block.
template <class T, int BS, int NREG>
__global__ void __launch_bounds__(BS * BS / 8, BS == 64 ? 1 : (NREG <= 16 ? 4 : 3)) softmax_block_row_kernel(const CompoundSoftmax::Arguments a) {
  constexpr int G = BS / 8, SB = 8;
  constexpr int64_t bb = int64_t(BS) * BS, wpm = bb / 64;
  const int64_t br = blockIdx.x, bh = blockIdx.y;
  const int r = int(threadIdx.x) / G, v = int(threadIdx.x) % G, c0 = v * 8;
  const int64_t q = br * BS + r;
  const bool valid = q < a.shape.Lq;
  const float sl2 = a.scale * 1.4426950408889634f;  // scale * log2(e)
  const int64_t cfirst = a.coarse.row_offsets[br];
  const int nb = int(a.coarse.row_offsets[br + 1] - cfirst);
  int64_t ffirst = 0, flast = 0;
  if (valid && a.fine.nnz > 0) {
    ffirst = a.fine.row_offsets[q];
    flast = a.fine.row_offsets[q + 1];
  }
  const int64_t off = (bh * a.coarse.nblocks + cfirst) * bb + int64_t(r) * BS + c0;
  const T* Sc = static_cast<const T*>(a.s_coarse) + off;
  const T* Sf = static_cast<const T*>(a.s_fine) + bh * a.fine.nnz;

  // The kept bits of this thread's 8 columns in block i of the row: mask bits and in range.
  auto bits_of = [&](int i) -> unsigned {
    if (!valid) return 0u;
    const int64_t blk = cfirst + i;
    const int32_t mi = a.coarse.mask_index[blk];
    unsigned bits = 0xffu;
    if (mi >= 0) {
      // 8 bits inside one 32-bit half of a 64-bit word (c0 % 8 == 0; little-endian halves).
      const int64_t bit = int64_t(r) * BS + c0;
      const uint32_t* w32 = reinterpret_cast<const uint32_t*>(a.coarse.masks + mi * wpm + bit / 64);
      bits = (w32[(bit % 64) / 32] >> (bit % 32)) & 0xffu;
    }
    const int64_t rem = a.shape.Lk - (int64_t(a.coarse.cols[blk]) * BS + c0);
    if (rem < 8) bits &= rem <= 0 ? 0u : ((1u << rem) - 1u);
    return bits;
  };
  auto ld = [&](int i) { return *reinterpret_cast<const uint4*>(Sc + int64_t(i) * bb); };

  float m = -CUDART_INF_F, l = 0.f;
  auto absorb = [&](float mx, auto&& sum_with) {  // a group of values with max mx (scaled, log2 domain); NaN: l NaN
    if (mx != mx) {
      l = CUDART_NAN_F;
      return;
    }
    if (mx == -CUDART_INF_F) return;
    if (mx > m) {
      l *= exp2f(m - mx);
      m = mx;
    }
    l += sum_with(m);
  };
  // Max and sum of a group of N blocks held in u[] with kept bits kb(i).
  auto absorb_blocks = [&](auto& u, auto&& kb, int n, auto N) {
    float mx = -CUDART_INF_F;
#pragma unroll
    for (int i = 0; i < decltype(N)::value; ++i) {
      if (i >= n) break;
      float f[8];
      unpack<T>(u[i], f);
      const unsigned k = kb(i);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if ((k >> e) & 1u) mx = max_nan(mx, f[e] * sl2);
    }
    absorb(mx, [&](float mm) {
      float t = 0.f;
#pragma unroll
      for (int i = 0; i < decltype(N)::value; ++i) {
        if (i >= n) break;
        float f[8];
        unpack<T>(u[i], f);
        const unsigned k = kb(i);
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if ((k >> e) & 1u) t += exp2f(f[e] * sl2 - mm);
      }
      return t;
    });
  };

  // ---- pass 1: the first NREG blocks into registers, the rest streamed --------------------------------
  uint4 cache[NREG];
  uint32_t kbp[(NREG + 3) / 4];
#pragma unroll
  for (int i = 0; i < NREG; ++i)
    if (i < nb) cache[i] = ld(i);
#pragma unroll
  for (int j = 0; j < (NREG + 3) / 4; ++j) kbp[j] = 0u;
#pragma unroll
  for (int i = 0; i < NREG; ++i)
    if (i < nb) kbp[i / 4] |= bits_of(i) << (8 * (i % 4));
  auto cached_bits = [&](int i) { return (kbp[i / 4] >> (8 * (i % 4))) & 0xffu; };
  absorb_blocks(cache, cached_bits, nb, std::integral_constant<int, NREG>{});
  for (int b0 = NREG; b0 < nb; b0 += SB) {
    uint4 buf[SB];
    unsigned kbs[SB];
#pragma unroll
    for (int i = 0; i < SB; ++i)
      if (b0 + i < nb) buf[i] = ld(b0 + i);
#pragma unroll
    for (int i = 0; i < SB; ++i) kbs[i] = b0 + i < nb ? bits_of(b0 + i) : 0u;
    absorb_blocks(buf, [&](int i) { return kbs[i]; }, nb - b0, std::integral_constant<int, SB>{});
  }
  // The row's fine entries, G lanes apart.
  for (int64_t i0 = ffirst; i0 < flast; i0 += 4 * G) {
    float x[4];
    float mx = -CUDART_INF_F;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t i = i0 + j * G + v;
      x[j] = i < flast ? Num<T>::to(Sf[i]) * sl2 : -CUDART_INF_F;
      mx = max_nan(mx, x[j]);
    }
    absorb(mx, [&](float mm) {
      float t = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) t += exp2f(x[j] - mm);  // exp2(-inf) = 0 for the tail
      return t;
    });
  }
  // ---- the row's max and sum over its G lanes (adjacent lanes of one warp) ------------------------------
  float M = m;
#pragma unroll
  for (int o = G / 2; o > 0; o /= 2) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  float L = M == -CUDART_INF_F ? l : l * exp2f(m - M);  // M = -inf: every l is 0 or NaN
#pragma unroll
  for (int o = G / 2; o > 0; o /= 2) L += __shfl_xor_sync(0xffffffffu, L, o);
  const float lse2 = L == 0.f ? -CUDART_INF_F : M + log2f(L);
  if (valid && v == 0 && a.lse2) a.lse2[bh * a.shape.Lq + q] = lse2 == -CUDART_INF_F ? CUDART_INF_F : lse2;
  if (valid && v == 0 && a.lse) a.lse[bh * a.shape.Lq + q] = lse2 == -CUDART_INF_F ? lse2 : lse2 * 0.6931471805599453f;
  if (!a.p_coarse && !a.p_fine) return;  // LSE only

  // ---- pass 2: P ----------------------------------------------------------------------------------------
  T* Pc = static_cast<T*>(a.p_coarse) + off;
  auto write_blocks = [&](auto& u, auto&& kb, int base, int n, auto N) {
#pragma unroll
    for (int i = 0; i < decltype(N)::value; ++i) {
      if (i >= n) break;
      float f[8];
      unpack<T>(u[i], f);
      const unsigned k = kb(i);
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] = (k >> e) & 1u ? exp2f(f[e] * sl2 - lse2) : 0.f;
      *reinterpret_cast<uint4*>(Pc + int64_t(base + i) * bb) = pack<T>(f);
    }
  };
  write_blocks(cache, cached_bits, 0, nb, std::integral_constant<int, NREG>{});
  for (int b0 = NREG; b0 < nb; b0 += SB) {
    uint4 buf[SB];
    unsigned kbs[SB];
#pragma unroll
    for (int i = 0; i < SB; ++i)
      if (b0 + i < nb) buf[i] = ld(b0 + i);
#pragma unroll
    for (int i = 0; i < SB; ++i) kbs[i] = b0 + i < nb ? bits_of(b0 + i) : 0u;
    write_blocks(buf, [&](int i) { return kbs[i]; }, b0, nb - b0, std::integral_constant<int, SB>{});
  }
  T* Pf = static_cast<T*>(a.p_fine) + bh * a.fine.nnz;
  for (int64_t i = ffirst + v; i < flast; i += G) Pf[i] = Num<T>::from(exp2f(Num<T>::to(Sf[i]) * sl2 - lse2));
}

// TileSoftmax: one CTA (8 warps) per (64-row tile, b*h). The tile's entries are one contiguous range in the
// tiles' order (S from SddmmFineTc with tile_order) and in CSR order (rows q0..q0+63): S is gathered into
// CSR order in shared memory, each warp reduces two rows at a time there (a half-warp a row: 4 shuffle
// steps, 9% fewer instructions than a warp a row), P goes out at the CSR places and back over
// S in the tiles' order for the SpMM. 8 entries a global load or store: S and the places (16-bit offsets in
// the tile where the plan has them, else CSR indices) in 16-byte loads, P in 16-byte stores, at the CSR
// places from shared memory laid out with the 16-byte phase of the destination, in tile order from the
// gather. Groups of 8 that straddle the tile's range are read whole and written entry by entry (the
// neighbour tile's CTA writes the rest). A row's values stay in registers (up to 256 a row) from the max
// pass to P, e = 2^(S sl2 - max) is kept from the sum pass so P = e / sum is a multiply: one MUFU.EX2
// an entry. The first version (2-byte loads and stores, 4-byte places, three passes over shared memory
// with exp2f) ran random(205) at 1.2 TB/s, issue bound (SM 68%); this one moves ~1.4 TB/s in ncu (S from
// DRAM) and cuts attention with P by ~30 us in the pipeline (S partly still in L2).
// Heads are taken last first: the SDDMM wrote them in order, so the last heads' S is likeliest in L2.
// PDL: the row starts load before pdl_wait(); S after it; every global write follows it.
constexpr int kTsOff = 68;  // row starts in shared memory (65 used; 272 bytes keep the values 16-byte aligned)

template <class PT>
struct TsPlaces;
template <>
struct TsPlaces<uint16_t> {  // 8 places, local to the tile
  uint4 w;
  __device__ __forceinline__ void load(const void* p, int64_t j) { w = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p) + j)); }
  __device__ __forceinline__ int at(int e, int) const {
    const uint32_t x = e < 2 ? w.x : e < 4 ? w.y : e < 6 ? w.z : w.w;
    return int((e & 1) ? x >> 16 : x & 0xffffu);
  }
};
template <>
struct TsPlaces<int32_t> {  // 8 CSR indices
  uint4 w[2];
  __device__ __forceinline__ void load(const void* p, int64_t j) {
    const uint4* q = reinterpret_cast<const uint4*>(static_cast<const int32_t*>(p) + j);
    w[0] = __ldg(q);
    w[1] = __ldg(q + 1);
  }
  __device__ __forceinline__ int at(int e, int base) const {
    const uint4& v = w[e / 4];
    const uint32_t x = (e & 3) == 0 ? v.x : (e & 3) == 1 ? v.y : (e & 3) == 2 ? v.z : v.w;
    return int(x) - base;
  }
};

template <class T, class PT>
__global__ void __launch_bounds__(256, 4) tile_softmax_kernel(const TileSoftmax::Arguments a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  int* sOff = reinterpret_cast<int*>(smem_raw);           // [kTsOff] row starts, local to the tile
  T* sm = reinterpret_cast<T*>(smem_raw + 4 * kTsOff);    // [ph + entries] CSR order, 16-byte phase ph
  constexpr int U = sizeof(PT) == 2 ? 4 : 3;              // groups of 8 in flight per thread
  pdl_launch_dependents();
  const int tile = blockIdx.x;
  const int64_t bh = gridDim.y - 1 - blockIdx.y;
  const int64_t q0 = int64_t(tile) * kFineTileRows;
  const int nrows = int((q0 + kFineTileRows < a.shape.Lq ? q0 + kFineTileRows : a.shape.Lq) - q0);
  const int pa = a.tiles.tile_pairs[tile], pb = a.tiles.tile_pairs[tile + 1];
  const int j0 = pa < pb ? a.tiles.groups[pa * 4] : 0, j1 = pa < pb ? a.tiles.groups[pb * 4] : 0;
  const int64_t base64 = a.fine.row_offsets[q0];
  if (int(threadIdx.x) <= nrows) sOff[threadIdx.x] = int(a.fine.row_offsets[q0 + threadIdx.x] - base64);
  const int base = int(base64);  // nnz < 2^31 on the tensor-core path
  const void* places = std::is_same_v<PT, uint16_t> ? static_cast<const void*>(a.tiles.pos16) : static_cast<const void*>(a.tiles.pos);
  T* S = static_cast<T*>(a.s) + bh * a.s_stride;
  T* Pc = a.p_csr ? static_cast<T*>(a.p_csr) + bh * a.fine.nnz + base64 : nullptr;
  const int ph = Pc ? int((reinterpret_cast<uintptr_t>(Pc) >> 1) & 7) : 0;  // Pc - ph is 16-byte aligned
  const int g0 = j0 & ~7, ng = (j1 - g0 + 7) >> 3;
  T* smp = sm + ph;  // entry i of the tile's CSR range
  pdl_wait();  // S is the SDDMM's

  // ---- 1. S (tile order) -> shared memory in CSR order ----
  for (int g = int(threadIdx.x); g < ng; g += 256 * U) {
    uint4 v[U];
    TsPlaces<PT> at[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (g + u * 256 < ng) {
        const int jb = g0 + 8 * (g + u * 256);
        v[u] = *reinterpret_cast<const uint4*>(S + jb);
        at[u].load(places, jb);
      }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (g + u * 256 < ng) {
        const int jb = g0 + 8 * (g + u * 256);
        const T* h = reinterpret_cast<const T*>(&v[u]);
        if (jb >= j0 && jb + 8 <= j1) {  // all but the two groups at the ends
#pragma unroll
          for (int e = 0; e < 8; ++e) smp[at[u].at(e, base)] = h[e];
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e)
            if (unsigned(jb + e - j0) < unsigned(j1 - j0)) smp[at[u].at(e, base)] = h[e];
        }
      }
  }
  __syncthreads();

  const float sl2 = a.scale * 1.4426950408889634f;  // scale * log2(e)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // ---- 2. rows: two rows a warp (a half-warp each, 4 shuffle steps), up to 16 * K values in registers ----
  constexpr int K = 16;
  const int hw = lane / 16, hl = lane % 16;
  for (int rb = 2 * warp; rb < nrows; rb += 16) {
    const int r = rb + hw;
    const bool valid = r < nrows;
    const int r0 = valid ? sOff[r] : 0, r1 = valid ? sOff[r + 1] : 0, n = r1 - r0;
    const int nw = max(n, __shfl_xor_sync(0xffffffffu, n, 16));  // warp-uniform slot bound
    float e[K];
    float m = -CUDART_INF_F;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      e[k] = -CUDART_INF_F;
      if (16 * k < nw) {
        const int i = r0 + 16 * k + hl;
        if (i < r1) e[k] = Num<T>::to(smp[i]);
        m = fmaxf(m, e[k]);
      }
    }
    for (int i = r0 + 16 * K + hl; i < r1; i += 16) m = fmaxf(m, Num<T>::to(smp[i]));
#pragma unroll
    for (int o = 8; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    // m is the half's row max (-inf for an empty row: then every e is 2^-inf = 0 and nothing is written).
    const float ms = m == -CUDART_INF_F ? 0.f : m * sl2;
    float l = 0.f;
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (16 * k < nw) {
        e[k] = ex2_ftz(fmaf(e[k], sl2, -ms));
        l += e[k];
      }
    for (int i = r0 + 16 * K + hl; i < r1; i += 16) l += ex2_ftz(fmaf(Num<T>::to(smp[i]), sl2, -ms));
#pragma unroll
    for (int o = 8; o > 0; o /= 2) l += __shfl_xor_sync(0xffffffffu, l, o);
    if (scaled_max_lost(m, sl2)) l = CUDART_NAN_F;  // P and LSE NaN (ptx.cuh)
    float lse2 = -CUDART_INF_F;
    if (l != 0.f) {  // not l > 0: a NaN score (skipped by fmaxf, m -inf where all are NaN) makes l and P NaN
      lse2 = ms + log2f(l);
      const float inv = 1.f / l;  // l >= 1 where finite: the max contributes 2^0
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (16 * k < nw) {
          const int i = r0 + 16 * k + hl;
          if (i < r1) smp[i] = Num<T>::from(e[k] * inv);
        }
      for (int i = r0 + 16 * K + hl; i < r1; i += 16) smp[i] = Num<T>::from(ex2_ftz(fmaf(Num<T>::to(smp[i]), sl2, -lse2)));
    }
    if (hl == 0 && valid && a.lse) a.lse[bh * a.shape.Lq + q0 + r] = lse2 == -CUDART_INF_F ? lse2 : lse2 * 0.6931471805599453f;
  }
  __syncthreads();

  // ---- 3. P out: at the CSR places (16-byte stores, streaming: nothing reads it back here) ----
  if (Pc) {
    const int n = sOff[nrows], nv = (ph + n + 7) >> 3;
    T* Pa = Pc - ph;
    for (int k = int(threadIdx.x); k < nv; k += 256) {
      const int lo = 8 * k;
      if (lo >= ph && lo + 8 <= ph + n) {
        __stcs(reinterpret_cast<uint4*>(Pa + lo), *reinterpret_cast<const uint4*>(sm + lo));
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (lo + e >= ph && lo + e < ph + n) Pa[lo + e] = sm[lo + e];
      }
    }
  }
  // ... and in tile order over S, for the SpMM.
  for (int g = int(threadIdx.x); g < ng; g += 256 * U) {
    TsPlaces<PT> at[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (g + u * 256 < ng) at[u].load(places, g0 + 8 * (g + u * 256));
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (g + u * 256 < ng) {
        const int jb = g0 + 8 * (g + u * 256);
        uint4 o;
        T* h = reinterpret_cast<T*>(&o);
        if (jb >= j0 && jb + 8 <= j1) {
#pragma unroll
          for (int e = 0; e < 8; ++e) h[e] = smp[at[u].at(e, base)];
          *reinterpret_cast<uint4*>(S + jb) = o;
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e)
            if (unsigned(jb + e - j0) < unsigned(j1 - j0)) S[jb + e] = smp[at[u].at(e, base)];
        }
      }
  }
}

template <class T>
void launch(const CompoundSoftmax::Arguments& a, cudaStream_t stream) {
  if constexpr (sizeof(T) == 2) {
    const auto a16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    if (a.coarse.nblocks > 0 && a16(a.s_coarse) && a16(a.p_coarse)) {
      dim3 grid(grid_dim(a.coarse.block_rows, "softmax block rows"), unsigned(a.shape.bh()));
      if (a.coarse.block == 64)
        softmax_block_row_kernel<T, 64, 8><<<grid, 64 * 64 / 8, 0, stream>>>(a);
      else if (a.row_blocks_hint <= 16)
        softmax_block_row_kernel<T, 32, 16><<<grid, 32 * 32 / 8, 0, stream>>>(a);
      else
        softmax_block_row_kernel<T, 32, 24><<<grid, 32 * 32 / 8, 0, stream>>>(a);
      SPATTN_LAUNCH_CHECK("softmax_block_row_kernel");
      return;
    }
  }
  const int64_t rows = a.coarse.nblocks > 0 ? a.coarse.block_rows * a.coarse.block : a.shape.Lq;
  dim3 grid(grid_dim((rows + 7) / 8, "softmax rows"), unsigned(a.shape.bh()));
  if (a.coarse.nblocks > 0 && a.coarse.block == 32)
    softmax_kernel<T, 32><<<grid, 256, 0, stream>>>(a, rows);
  else
    softmax_kernel<T, 64><<<grid, 256, 0, stream>>>(a, rows);
  SPATTN_LAUNCH_CHECK("softmax_kernel");
}

}  // namespace

Status CompoundSoftmax::can_implement(const Arguments& a) {
  if (Status s = check_shape(a.shape); !s) return s;
  if (a.shape.dtype == DType::f64) return Status::fail("dtype f64 is not supported on the GPU");
  if (a.shape.bh() > 65535) return Status::fail("batch * q_heads " + std::to_string(a.shape.bh()) + " > 65535");
  if (!(a.scale >= 0.f) || !std::isfinite(a.scale)) return Status::fail("scale " + std::to_string(a.scale) + " is not a finite number >= 0");
  const bool lse_only = a.lse2 && !a.p_coarse && !a.p_fine;
  if (a.coarse.nblocks > 0 && (!a.s_coarse || (!a.p_coarse && !lse_only)))
    return Status::fail("the plan has a coarse part but S or P coarse is null");
  if (a.fine.nnz > 0 && (!a.s_fine || (!a.p_fine && !lse_only)))
    return Status::fail("the plan has a fine part but S or P fine is null");
  if (a.coarse.nblocks > 0 && a.coarse.block != 32 && a.coarse.block != 64)
    return Status::fail("block " + std::to_string(a.coarse.block) + " is not 32 or 64");
  return Status::success();
}

Status TileSoftmax::can_implement(const Arguments& a) {
  if (Status s = check_shape(a.shape); !s) return s;
  if (a.shape.dtype != DType::bf16 && a.shape.dtype != DType::f16)
    return Status::fail("tile softmax: dtype " + std::string(dtype_name(a.shape.dtype)) + " is not bf16 or f16");
  if (a.shape.bh() > 65535) return Status::fail("batch * q_heads " + std::to_string(a.shape.bh()) + " > 65535");
  if (!(a.scale >= 0.f) || !std::isfinite(a.scale)) return Status::fail("scale " + std::to_string(a.scale) + " is not a finite number >= 0");
  if (a.max_tile_entries < 0 || a.max_tile_entries > kMaxTileEntries)
    return Status::fail("tile softmax: a tile holds " + std::to_string(a.max_tile_entries) + " entries (at most " +
                           std::to_string(kMaxTileEntries) + ")");
  if (a.tiles.ntiles != (a.shape.Lq + kFineTileRows - 1) / kFineTileRows) return Status::fail("tile softmax: tiles do not cover the rows");
  if (a.s_stride < a.fine.nnz || a.s_stride % 8 != 0)
    return Status::fail("tile softmax: s_stride " + std::to_string(a.s_stride) + " is below nnz " + std::to_string(a.fine.nnz) +
                           " or no multiple of 8");
  if (a.fine.nnz > 0 && !aligned16(a.s)) return Status::fail("tile softmax: S is not 16-byte aligned");
  if (a.tiles.pos16 && a.max_tile_entries > 65536) return Status::fail("tile softmax: 16-bit places for tiles of > 65536 entries");
  if (a.fine.nnz > 0 && (!a.s || !a.fine.row_offsets || !a.tiles.tile_pairs || !a.tiles.groups || !a.tiles.pos))
    return Status::fail("tile softmax: null S or fine metadata");
  return Status::success();
}

void TileSoftmax::run(const Arguments& a, cudaStream_t stream) {
  require(can_implement(a), "TileSoftmax");
  if (a.tiles.ntiles == 0) return;
  dim3 grid(grid_dim(a.tiles.ntiles, "tile softmax tiles"), unsigned(a.shape.bh()));
  const size_t smem = 4 * kTsOff + size_t(std::max<int64_t>(a.max_tile_entries, 8) + 8) * 2;
  auto go = [&](auto kernel) {
    if (smem > 48 * 1024)
      SPATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    cuda::launch_pdl(a.pdl, kernel, grid, dim3(256), smem, stream, a);
  };
  auto pick = [&](auto t) {
    using T = decltype(t);
    if (a.tiles.pos16) go(tile_softmax_kernel<T, uint16_t>);
    else go(tile_softmax_kernel<T, int32_t>);
  };
  if (a.shape.dtype == DType::bf16) pick(__nv_bfloat16{});
  else pick(__half{});
  SPATTN_LAUNCH_CHECK("tile_softmax_kernel");
}

void CompoundSoftmax::run(const Arguments& a, cudaStream_t stream) {
  require(can_implement(a), "CompoundSoftmax");
  switch (a.shape.dtype) {
    case DType::bf16: launch<__nv_bfloat16>(a, stream); break;
    case DType::f16: launch<__half>(a, stream); break;
    default: launch<float>(a, stream); break;
  }
}

}  // namespace spattn::unfused::detail
