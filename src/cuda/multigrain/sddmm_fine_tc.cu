// Fine part on tensor cores, for a fine part dense enough in 64 x 64 tiles (random(L/20) has 5% of every
// tile: 205 kept scores per tile). Bytes bound the CUDA-core kernel there: it fetches a 128-byte K row from
// L2 per entry (3.4 GB at L = 4096, B*H = 32: 0.58 ms at ~6 TB/s), while the tensor cores compute a whole
// 64 x 64 x 64 tile in 32 mma.sync per warp. So a CTA takes 64 query rows (4 warps x 16), keeps Q in shared
// memory, streams the K chunks of the tile's occupied pairs through two buffers (cp.async, 8 KB each: every
// K row is read from L2 once per tile instead of once per entry) and computes the full 64 x 64 scores; each
// warp stages its 16 x 64 in shared memory and stores only its kept entries, found through the per-(pair,
// warp) entry list built at plan time (CSR index + place in the tile; loaded before the chunk's barrier).
//   SDDMM: items {tile, first pair, last pair} (a tile's pairs sliced, 16 at most, for load balance).
//   SpMM:  one CTA per (tile, b*h, 64 value columns) over all of the tile's pairs; each warp scatters its
//          kept P into a zeroed 16 x 64 tile in shared memory, multiplies it by the V chunk (ldmatrix.trans),
//          and writes its 16 rows of O (zeros for rows with no entries). In attention() without P it
//          reads S and forms P = exp2(S * scale * log2 e - lse2) itself (the softmax then writes only the
//          LSE: P is neither written nor read back).
#include <math_constants.h>

#include "common.cuh"

namespace spattn::multigrain::detail {
namespace {

constexpr int kSP = kFineChunkKeys + 8;  // staging pitch (halves): conflict-free ldmatrix / 32-bit stores

// DK: the head dim at compile time (32, 64, 128: Q's fragments stay in registers for the whole item, so a
// chunk's MMA reads only K from shared memory: 16 instead of 20 ldmatrix.x4 per warp at D = 64), or 0.
template <class T, int DK>
__global__ void __launch_bounds__(128) sddmm_fine_tc_kernel(const SddmmFineTc::Arguments a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int D = DK > 0 ? DK : int(a.shape.D), pitch = D + 8;
  T* sQ = reinterpret_cast<T*>(smem_raw);  // [64][pitch]
  T* sK = sQ + kFineTileRows * pitch;       // [2][64][pitch]
  T* sS = sK + 2 * kFineChunkKeys * pitch;  // [4][16][kSP]

  const int tile = a.items[3 * blockIdx.x], p0 = a.items[3 * blockIdx.x + 1], p1 = a.items[3 * blockIdx.x + 2];
  const int64_t bh = blockIdx.y;
  const int64_t b = bh / a.shape.Hq, h = bh % a.shape.Hq, hk = h / (a.shape.Hq / a.shape.Hkv);
  const T* Qg = static_cast<const T*>(a.q.data) + b * a.q.sb + h * a.q.sh;
  const T* Kg = static_cast<const T*>(a.k.data) + b * a.k.sb + hk * a.k.sh;
  const int chunks = D / 8;
  for (int i = threadIdx.x; i < kFineTileRows * chunks; i += 128) {
    const int r = i / chunks, c = i % chunks;
    const int64_t q = int64_t(tile) * kFineTileRows + r;
    const bool ok = q < a.shape.Lq;
    cp_async16(sQ + r * pitch + c * 8, Qg + (ok ? q : 0) * a.q.sl + c * 8, ok);
  }
  auto load_k = [&](int chunk, int buf) {
    const int64_t k0 = int64_t(chunk) * kFineChunkKeys;
    T* dst = sK + buf * kFineChunkKeys * pitch;
    for (int i = threadIdx.x; i < kFineChunkKeys * chunks; i += 128) {
      const int r = i / chunks, c = i % chunks;
      const bool ok = k0 + r < a.shape.Lk;
      cp_async16(dst + r * pitch + c * 8, Kg + (ok ? k0 + r : 0) * a.k.sl + c * 8, ok);
    }
  };
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Metadata runs ahead of the data (every load here is a dependent L2 round trip, so none may sit on the
  // critical path of a chunk): chunk and group bounds two pairs ahead, the first two entries per lane one
  // pair ahead.
  const int32_t* G = a.tiles.groups;
  int gA0 = G[p0 * 4 + warp], gA1 = G[p0 * 4 + warp + 1];
  int gB0 = 0, gB1 = 0, chunkB = 0;
  if (p0 + 1 < p1) {
    gB0 = G[(p0 + 1) * 4 + warp];
    gB1 = G[(p0 + 1) * 4 + warp + 1];
    chunkB = a.tiles.pair_chunk[p0 + 1];
  }
  int32_t posA0 = 0, posA1 = 0;
  uint32_t rcA0 = 0, rcA1 = 0;
  auto fetch = [&](int g0, int g1, int32_t& pos0, uint32_t& rc0, int32_t& pos1, uint32_t& rc1) {
    if (g0 + lane < g1) {
      pos0 = a.tiles.pos[g0 + lane];
      rc0 = a.tiles.rc[g0 + lane];
    }
    if (g0 + 32 + lane < g1) {
      pos1 = a.tiles.pos[g0 + 32 + lane];
      rc1 = a.tiles.rc[g0 + 32 + lane];
    }
  };
  fetch(gA0, gA1, posA0, rcA0, posA1, rcA1);
  load_k(a.tiles.pair_chunk[p0], 0);
  cp_async_commit();

  T* ws = sS + warp * 16 * kSP;
  T* out = static_cast<T*>(a.s) + bh * a.nnz;
  constexpr int NQ = DK > 0 ? DK / 16 : 1;
  uint32_t qf[NQ][4];
  for (int p = p0; p < p1; ++p) {
    const int buf = (p - p0) & 1;
    if (p + 1 < p1) load_k(chunkB, buf ^ 1);
    cp_async_commit();
    int gC0 = 0, gC1 = 0, chunkC = 0;
    if (p + 2 < p1) {
      gC0 = G[(p + 2) * 4 + warp];
      gC1 = G[(p + 2) * 4 + warp + 1];
      chunkC = a.tiles.pair_chunk[p + 2];
    }
    int32_t posB0 = 0, posB1 = 0;
    uint32_t rcB0 = 0, rcB1 = 0;
    if (p + 1 < p1) fetch(gB0, gB1, posB0, rcB0, posB1, rcB1);
    cp_async_wait<1>();
    __syncthreads();
    if constexpr (DK > 0) {  // first chunk: Q landed with it; its fragments into registers once
      if (p == p0) {
#pragma unroll
        for (int kk = 0; kk < NQ; ++kk)
          ldmatrix_x4(qf[kk], sQ + (warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * pitch + kk * 16 + (lane / 16) * 8);
      }
    }
    if (gA0 < gA1) {  // warp-uniform: a warp with no entries in this chunk skips it
      float acc[8][4];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
      const T* kb = sK + buf * kFineChunkKeys * pitch;
      auto step = [&](int k0, const uint32_t (&af)[4]) {
#pragma unroll
        for (int nt = 0; nt < 8; nt += 2) {
          uint32_t bf[4];
          ldmatrix_x4(bf, kb + (nt * 8 + (lane % 8) + (lane / 16) * 8) * pitch + k0 + ((lane / 8) % 2) * 8);
          mma16816<T>(acc[nt], af, bf[0], bf[1]);
          mma16816<T>(acc[nt + 1], af, bf[2], bf[3]);
        }
      };
      if constexpr (DK > 0) {
#pragma unroll
        for (int kk = 0; kk < NQ; ++kk) step(kk * 16, qf[kk]);
      } else {
        for (int k0 = 0; k0 < D; k0 += 16) {
          uint32_t af[4];
          ldmatrix_x4(af, sQ + (warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * pitch + k0 + (lane / 16) * 8);
          step(k0, af);
        }
      }
      const int r0 = lane / 4;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int c = nt * 8 + 2 * (lane % 4);
        T v0[2] = {Num<T>::from(acc[nt][0]), Num<T>::from(acc[nt][1])};
        T v1[2] = {Num<T>::from(acc[nt][2]), Num<T>::from(acc[nt][3])};
        *reinterpret_cast<uint32_t*>(ws + r0 * kSP + c) = *reinterpret_cast<uint32_t*>(v0);
        *reinterpret_cast<uint32_t*>(ws + (r0 + 8) * kSP + c) = *reinterpret_cast<uint32_t*>(v1);
      }
      __syncwarp();
      if (gA0 + lane < gA1) out[posA0] = ws[((rcA0 >> 6) & 15) * kSP + (rcA0 & 63)];
      if (gA0 + 32 + lane < gA1) out[posA1] = ws[((rcA1 >> 6) & 15) * kSP + (rcA1 & 63)];
      for (int j = gA0 + 64 + lane; j < gA1; j += 32) {  // a crowded chunk: the rest straight from L2
        const uint32_t rc = a.tiles.rc[j];
        out[a.tiles.pos[j]] = ws[((rc >> 6) & 15) * kSP + (rc & 63)];
      }
      __syncwarp();
    }
    __syncthreads();  // the K buffer just read is the next prefetch's target
    gA0 = gB0; gA1 = gB1;
    gB0 = gC0; gB1 = gC1;
    chunkB = chunkC;
    posA0 = posB0; posA1 = posB1; rcA0 = rcB0; rcA1 = rcB1;
  }
}

template <class T>
__global__ void __launch_bounds__(128) spmm_fine_tc_kernel(const SpmmFineTc::Arguments a) {
  constexpr int VP = 64 + 8;
  __shared__ __align__(16) T sV[2][kFineChunkKeys * VP];
  __shared__ __align__(16) T sP[4][16 * kSP];

  const int tile = blockIdx.x;
  const int64_t bh = blockIdx.y;
  const int dv0 = blockIdx.z * 64;
  const int64_t b = bh / a.shape.Hq, h = bh % a.shape.Hq, hk = h / (a.shape.Hq / a.shape.Hkv);
  const T* Vg = static_cast<const T*>(a.v.data) + b * a.v.sb + hk * a.v.sh;
  const T* Pg = static_cast<const T*>(a.p) + bh * a.nnz;
  const int Dv = int(a.shape.Dv);
  const int p0 = a.tiles.tile_pairs[tile], p1 = a.tiles.tile_pairs[tile + 1];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  T* wp = sP[warp];
  for (int i = lane; i < 16 * kSP / 8; i += 32) reinterpret_cast<uint4*>(wp)[i] = make_uint4(0, 0, 0, 0);
  // With lse2, Pg holds S: P = exp2(S * sl2 - lse2[row]) as it is gathered (rows of the tile staged here).
  __shared__ float sL[kFineTileRows];
  if (a.lse2) {
    if (threadIdx.x < kFineTileRows) {
      const int64_t q = int64_t(tile) * kFineTileRows + threadIdx.x;
      sL[threadIdx.x] = q < a.shape.Lq ? a.lse2[bh * a.shape.Lq + q] : CUDART_INF_F;
    }
    __syncthreads();
  }
  const float sl2 = a.sl2;
  auto pval = [&](int32_t pos, uint32_t rc) -> T {
    if (!a.lse2) return Pg[pos];
    return Num<T>::from(exp2f(Num<T>::to(Pg[pos]) * sl2 - sL[rc >> 6]));
  };
  __syncwarp();
  auto load_v = [&](int chunk, int buf) {
    const int64_t k0 = int64_t(chunk) * kFineChunkKeys;
    for (int i = threadIdx.x; i < kFineChunkKeys * 8; i += 128) {
      const int r = i / 8, c = i % 8;
      const bool ok = k0 + r < a.shape.Lk && dv0 + c * 8 < Dv;
      cp_async16(&sV[buf][r * VP + c * 8], Vg + (ok ? (k0 + r) * a.v.sl + dv0 + c * 8 : 0), ok);
    }
  };
  float acc[8][4];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

  // Metadata and P run ahead of the V chunks as in the SDDMM: bounds two pairs ahead, the first two
  // entries per lane (place and P value) one pair ahead.
  const int32_t* G = a.tiles.groups;
  int gA0 = 0, gA1 = 0, gB0 = 0, gB1 = 0, chunkB = 0;
  uint32_t rcA0 = 0, rcA1 = 0;
  T pA0 = Num<T>::from(0.f), pA1 = Num<T>::from(0.f);
  auto fetch = [&](int g0, int g1, uint32_t& rc0, T& v0, uint32_t& rc1, T& v1) {
    if (g0 + lane < g1) {
      rc0 = a.tiles.rc[g0 + lane];
      v0 = pval(a.tiles.pos[g0 + lane], rc0);
    }
    if (g0 + 32 + lane < g1) {
      rc1 = a.tiles.rc[g0 + 32 + lane];
      v1 = pval(a.tiles.pos[g0 + 32 + lane], rc1);
    }
  };
  if (p0 < p1) {
    gA0 = G[p0 * 4 + warp];
    gA1 = G[p0 * 4 + warp + 1];
    if (p0 + 1 < p1) {
      gB0 = G[(p0 + 1) * 4 + warp];
      gB1 = G[(p0 + 1) * 4 + warp + 1];
      chunkB = a.tiles.pair_chunk[p0 + 1];
    }
    fetch(gA0, gA1, rcA0, pA0, rcA1, pA1);
    load_v(a.tiles.pair_chunk[p0], 0);
  }
  cp_async_commit();
  for (int p = p0; p < p1; ++p) {
    const int buf = (p - p0) & 1;
    if (p + 1 < p1) load_v(chunkB, buf ^ 1);
    cp_async_commit();
    if (gA0 < gA1) {  // scatter this pair's kept P into the warp's zeroed tile
      if (gA0 + lane < gA1) wp[((rcA0 >> 6) & 15) * kSP + (rcA0 & 63)] = pA0;
      if (gA0 + 32 + lane < gA1) wp[((rcA1 >> 6) & 15) * kSP + (rcA1 & 63)] = pA1;
      for (int j = gA0 + 64 + lane; j < gA1; j += 32) {
        const uint32_t rc = a.tiles.rc[j];
        wp[((rc >> 6) & 15) * kSP + (rc & 63)] = pval(a.tiles.pos[j], rc);
      }
    }
    int gC0 = 0, gC1 = 0, chunkC = 0;
    if (p + 2 < p1) {
      gC0 = G[(p + 2) * 4 + warp];
      gC1 = G[(p + 2) * 4 + warp + 1];
      chunkC = a.tiles.pair_chunk[p + 2];
    }
    uint32_t rcB0 = 0, rcB1 = 0;
    T pB0 = Num<T>::from(0.f), pB1 = Num<T>::from(0.f);
    if (p + 1 < p1) fetch(gB0, gB1, rcB0, pB0, rcB1, pB1);
    cp_async_wait<1>();
    __syncthreads();
    if (gA0 < gA1) {
      __syncwarp();
#pragma unroll
      for (int k0 = 0; k0 < kFineChunkKeys; k0 += 16) {
        uint32_t af[4];
        ldmatrix_x4(af, wp + ((lane % 8) + ((lane / 8) % 2) * 8) * kSP + k0 + (lane / 16) * 8);
#pragma unroll
        for (int nt = 0; nt < 8; nt += 2) {
          uint32_t bf[4];
          ldmatrix_x4_trans(bf, &sV[buf][(k0 + (lane % 8) + ((lane / 8) % 2) * 8) * VP + nt * 8 + (lane / 16) * 8]);
          mma16816<T>(acc[nt], af, bf[0], bf[1]);
          mma16816<T>(acc[nt + 1], af, bf[2], bf[3]);
        }
      }
      __syncwarp();
      const T zero = Num<T>::from(0.f);  // back to zeros for the next chunk
      if (gA0 + lane < gA1) wp[((rcA0 >> 6) & 15) * kSP + (rcA0 & 63)] = zero;
      if (gA0 + 32 + lane < gA1) wp[((rcA1 >> 6) & 15) * kSP + (rcA1 & 63)] = zero;
      for (int j = gA0 + 64 + lane; j < gA1; j += 32) {
        const uint32_t rc = a.tiles.rc[j];
        wp[((rc >> 6) & 15) * kSP + (rc & 63)] = zero;
      }
      __syncwarp();
    }
    __syncthreads();
    gA0 = gB0; gA1 = gB1;
    gB0 = gC0; gB1 = gC1;
    chunkB = chunkC;
    rcA0 = rcB0; rcA1 = rcB1; pA0 = pB0; pA1 = pB1;
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t q = int64_t(tile) * kFineTileRows + warp * 16 + lane / 4 + half * 8;
    if (q >= a.shape.Lq) continue;
    T* orow = static_cast<T*>(const_cast<void*>(a.o.data)) + b * a.o.sb + q * a.o.sl + h * a.o.sh;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const int c = dv0 + nt * 8 + 2 * (lane % 4);
      if (c >= Dv) continue;
      T pair[2] = {Num<T>::from(acc[nt][half * 2]), Num<T>::from(acc[nt][half * 2 + 1])};
      *reinterpret_cast<uint32_t*>(orow + c) = *reinterpret_cast<uint32_t*>(pair);
    }
  }
}

Status check_common(const Shape& sh, const FineTiles& t) {
  if (Status s = check_shape(sh); !s) return s;
  if (sh.dtype != DType::bf16 && sh.dtype != DType::f16)
    return Status::failure("fine tensor-core path: dtype " + std::string(dtype_name(sh.dtype)) + " is not bf16 or f16");
  if (sh.bh() > 65535) return Status::failure("batch * q_heads " + std::to_string(sh.bh()) + " > 65535");
  if (t.npairs > 0 && (!t.tile_pairs || !t.pair_chunk || !t.groups || !t.pos || !t.rc))
    return Status::failure("null fine tile metadata");
  return Status::success();
}

}  // namespace

Status SddmmFineTc::can_implement(const Arguments& a) {
  if (Status s = check_common(a.shape, a.tiles); !s) return s;
  if (a.shape.D % 16 != 0 || a.shape.D > 256)
    return Status::failure("head dim " + std::to_string(a.shape.D) + " is not a multiple of 16 up to 256");
  if (Status s = check_dense(a.q, a.shape.D, a.shape.dtype, "q"); !s) return s;
  if (Status s = check_dense(a.k, a.shape.D, a.shape.dtype, "k"); !s) return s;
  if (a.nitems > 0 && (!a.items || !a.s)) return Status::failure("null items or output pointer");
  return Status::success();
}

void SddmmFineTc::run(const Arguments& a, Stream stream) {
  require(can_implement(a), "SddmmFineTc");
  if (a.nitems == 0) return;
  const size_t smem = (size_t(3) * 64 * (a.shape.D + 8) + 4 * 16 * kSP) * 2;
  dim3 grid(grid_dim(a.nitems, "sddmm fine tc items"), unsigned(a.shape.bh()));
  auto go = [&](auto kernel) {
    if (smem > 48 * 1024)
      SPATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    kernel<<<grid, 128, smem, stream>>>(a);
  };
  auto pick = [&](auto t) {
    using T = decltype(t);
    switch (a.shape.D) {
      case 32: go(sddmm_fine_tc_kernel<T, 32>); break;
      case 64: go(sddmm_fine_tc_kernel<T, 64>); break;
      case 128: go(sddmm_fine_tc_kernel<T, 128>); break;
      default: go(sddmm_fine_tc_kernel<T, 0>); break;
    }
  };
  if (a.shape.dtype == DType::bf16) pick(__nv_bfloat16{});
  else pick(__half{});
  SPATTN_LAUNCH_CHECK("sddmm_fine_tc_kernel");
}

Status SpmmFineTc::can_implement(const Arguments& a) {
  if (Status s = check_common(a.shape, a.tiles); !s) return s;
  if (a.shape.Dv % 8 != 0 || a.shape.Dv > 256)
    return Status::failure("value dim " + std::to_string(a.shape.Dv) + " is not a multiple of 8 up to 256");
  if (Status s = check_dense(a.v, a.shape.Dv, a.shape.dtype, "v"); !s) return s;
  if (Status s = check_dense(a.o, a.shape.Dv, a.shape.dtype, "o"); !s) return s;
  if (a.nnz > 0 && !a.p) return Status::failure("p fine is null");
  if (a.tiles.ntiles > 0 && !a.tiles.tile_pairs) return Status::failure("null fine tile metadata");
  return Status::success();
}

void SpmmFineTc::run(const Arguments& a, Stream stream) {
  require(can_implement(a), "SpmmFineTc");
  if (a.tiles.ntiles == 0) return;
  dim3 grid(grid_dim(a.tiles.ntiles, "spmm fine tc tiles"), unsigned(a.shape.bh()), unsigned((a.shape.Dv + 63) / 64));
  if (a.shape.dtype == DType::bf16)
    spmm_fine_tc_kernel<__nv_bfloat16><<<grid, 128, 0, stream>>>(a);
  else
    spmm_fine_tc_kernel<__half><<<grid, 128, 0, stream>>>(a);
  SPATTN_LAUNCH_CHECK("spmm_fine_tc_kernel");
}

}  // namespace spattn::multigrain::detail
