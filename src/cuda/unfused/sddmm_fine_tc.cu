// Fine part on tensor cores, for a fine part dense enough in 64 x 64 tiles (random(L/20) has 5% of every
// tile: 205 kept scores per tile). Bytes bound the CUDA-core kernel there: it fetches a 128-byte K row from
// L2 per entry (3.4 GB at L = 4096, B*H = 32: 0.58 ms at ~6 TB/s), while the tensor cores compute a whole
// 64 x 64 x 64 tile in 32 mma.sync per warp. A CTA (8 warps) takes a 128-row super-tile (plan tiles 2T and
// 2T + 1, 4 warps each) and walks the union of their occupied 64-key chunks ("pairs"): every K/V chunk
// crosses from L2 once per 128 rows (with 64-row CTAs both kernels ran at ~3 TB/s of chunk traffic on an
// H100, 1.07 GB for random(205) at B*H = 32). Both kernels stream the chunks through three cp.async
// buffers, two pairs ahead, with one barrier per pair (the buffer refilled at pair p was last read at pair
// p - 1, which every warp has left once past pair p's barrier), and load the entry metadata one or more
// pairs ahead of its use (every such load is a dependent L2 round trip).
//   SDDMM: items {super-tile, first pair, last pair} (slices of 16 pairs at most, for load balance). Warp
//          w computes keys 16 (w % 4).. of the chunk for the 64 rows of half w / 4, so a K chunk is read
//          from shared memory twice per CTA (ldmatrix: 2 KB a warp; with 16 rows x 64 keys a warp it was
//          8 KB) and Q (64 rows a warp, D <= 64) stays in registers. The 128 x 64 S tile is staged in one
//          of two shared buffers and its kept entries are stored at the next pair, after the barrier that
//          publishes the tile: through the per-(pair, 16-row group) entry lists built at plan time, at the
//          CSR places or in the lists' own order (tile_order: coalesced stores, no CSR index loads).
//   SpMM:  one CTA per (super-tile, b*h, 64 value columns) over all of its pairs. P of pair p + 1 is
//          scattered into a zeroed 128 x 64 tile in shared memory (two of them) while pair p is
//          multiplied, after clearing pair p - 1's entries from it; warps take 32 rows x 32 value columns
//          (P and V fragments 4 + 4 KB a warp per pair). Every query row of O is written. P comes from the
//          CSR places or the lists' order; with lse2 it is S, and P = exp2(S * sl2 - lse2[row]) is formed
//          as it is scattered.
#include <math_constants.h>

#include "cuda/common/check.hpp"
#include "cuda/common/launch.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/unfused/checks.hpp"
#include "cuda/unfused/dtype.cuh"

namespace spattn::unfused::detail {
using namespace ::spattn::cuda::ptx;
namespace {

constexpr int kSP = kFineChunkKeys + 8;  // pitch (halves) of staged S / P tiles and V chunks: conflict-free
constexpr int kE = 3;  // entries per lane of a (pair, 16-row group) held in registers (96; more: from L2)

template <class T, int DK, bool TILE>
__global__ void __launch_bounds__(256, 2) sddmm_fine_tc_kernel(const SddmmFineTc::Arguments a) {
  // DK: the head dim at compile time (32, 64, 128) or 0; Q's fragments stay in registers for D <= 64.
  constexpr bool QREG = DK > 0 && DK <= 64;
  constexpr int NQ = QREG ? DK / 16 : 1;
  constexpr int NP = TILE ? 1 : kE;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int D = DK > 0 ? DK : int(a.shape.D), pitch = D + 8;
  T* sQ = reinterpret_cast<T*>(smem_raw);  // [128][pitch]
  T* sK = sQ + kSuperRows * pitch;          // [3][64][pitch]
  T* sS = sK + 3 * kFineChunkKeys * pitch;  // [2][128][kSP]

  pdl_launch_dependents();  // the tile softmax may start (and wait) as soon as every CTA of this grid runs
  const int tile = a.items[3 * blockIdx.x], p0 = a.items[3 * blockIdx.x + 1], p1 = a.items[3 * blockIdx.x + 2];
  if (p0 >= p1) return;  // uniform over the CTA
  const int64_t bh = blockIdx.y;
  const int64_t b = bh / a.shape.Hq, h = bh % a.shape.Hq, hk = h / (a.shape.Hq / a.shape.Hkv);
  const T* Qg = static_cast<const T*>(a.q.data) + b * a.q.sb + h * a.q.sh;
  const T* Kg = static_cast<const T*>(a.k.data) + b * a.k.sb + hk * a.k.sh;
  const int vecs = D / 8;
  for (int i = threadIdx.x; i < kSuperRows * vecs; i += 256) {
    const int r = i / vecs, c = i % vecs;
    const int64_t q = int64_t(tile) * kSuperRows + r;
    const bool ok = q < a.shape.Lq;
    cp_async16(sQ + r * pitch + c * 8, Qg + (ok ? q : 0) * a.q.sl + c * 8, ok ? 16 : 0);
  }
  // A K chunk: with D known, NL copies of 16 bytes a thread at rows kr0 + l RS, addresses set up once
  // here (the generic loop cost ~80 instructions a thread per pair: 64-bit row math, a remainder loop).
  constexpr int VECS = DK > 0 ? DK / 8 : 1, NL = DK > 0 ? kFineChunkKeys * VECS / 256 : 1, RS = 256 / VECS;
  const int kr0 = int(threadIdx.x) / VECS, kc0 = int(threadIdx.x) % VECS;
  const T* ksrc = Kg + kr0 * a.k.sl + kc0 * 8;
  const uint32_t kdst = smem_u32(sK + kr0 * pitch + kc0 * 8);
  const int64_t kchunk = kFineChunkKeys * a.k.sl, kstep = RS * a.k.sl;
  // Chunks below nfull are whole; the last one holds lastrows keys.
  const int nfull = int(a.shape.Lk / kFineChunkKeys), lastrows = int(a.shape.Lk % kFineChunkKeys);
  auto load_k = [&](int chunk, int buf) {
    if constexpr (DK > 0) {
      const int nr = chunk < nfull ? kFineChunkKeys : lastrows;
      const T* src = ksrc + chunk * kchunk;
      const uint32_t dst = kdst + buf * (kFineChunkKeys * pitch * 2);
#pragma unroll
      for (int l = 0; l < NL; ++l) {
        const bool ok = kr0 + l * RS < nr;
        cp_async16(dst + l * RS * pitch * 2, ok ? src + l * kstep : Kg, ok ? 16 : 0);
      }
    } else {
      const int64_t k0 = int64_t(chunk) * kFineChunkKeys;
      T* dst = sK + buf * kFineChunkKeys * pitch;
      for (int i = threadIdx.x; i < kFineChunkKeys * vecs; i += 256) {
        const int r = i / vecs, c = i % vecs;
        const bool ok = k0 + r < a.shape.Lk;
        cp_async16(dst + r * pitch + c * 8, Kg + (ok ? k0 + r : 0) * a.k.sl + c * 8, ok ? 16 : 0);
      }
    }
  };
  // Warp w: the 64 rows of tile half w / 4 x keys 16 (w % 4).. of each chunk; stores group w of the pair.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, half = warp / 4, wq = warp % 4;
  const int32_t* SB = a.tiles.sp_bounds;
  const int32_t* CH = a.tiles.sp_chunk;
  const uint16_t* RC = a.tiles.rc;
  const int32_t* POS = a.tiles.pos;
  T* out = static_cast<T*>(a.s) + bh * a.nnz;

  load_k(CH[p0], 0);
  cp_async_commit();  // Q and the first chunk
  if (p0 + 1 < p1) load_k(CH[p0 + 1], 1);
  cp_async_commit();
  int chunkN = p0 + 2 < p1 ? CH[p0 + 2] : 0;  // the chunk of pair p + 2 at the top of pair p
  // Bounds of this warp's group: pair p (its entries are loaded at pair p) and pair p - 1 (stored at p).
  int gA0 = SB[(p0 * 8 + warp) * 2], gA1 = SB[(p0 * 8 + warp) * 2 + 1];
  int gZ0 = 0, gZ1 = 0;
  uint32_t rcZ[kE];
  int32_t posZ[NP];
#pragma unroll
  for (int e = 0; e < kE; ++e) rcZ[e] = 0;
#pragma unroll
  for (int e = 0; e < NP; ++e) posZ[e] = 0;

  // Stores the kept entries of a group from its half (64 x 64) of a staged S tile.
  auto store = [&](int g0, int g1, const uint32_t (&rc)[kE], const int32_t (&pos)[NP], const T* st) {
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      const int j = g0 + 32 * e + lane;
      if (j < g1) out[TILE ? j : pos[TILE ? 0 : e]] = st[(rc[e] >> 6) * kSP + (rc[e] & 63)];
    }
    for (int j = g0 + 32 * kE + lane; j < g1; j += 32) {  // a crowded group: the rest straight from L2
      const uint32_t r = RC[j];
      out[TILE ? j : POS[j]] = st[(r >> 6) * kSP + (r & 63)];
    }
  };

  uint32_t qf[QREG ? 4 : 1][NQ][4];
  // B fragments of this warp's 16 keys: rows 16 wq.. of the K chunk; A (Q): rows of its half.
  const int koff = (wq * 16 + (lane % 8) + (lane / 16) * 8) * pitch + ((lane / 8) % 2) * 8;
  const int qoff = (half * kFineTileRows + (lane % 8) + ((lane / 8) % 2) * 8) * pitch + (lane / 16) * 8;
  const int hoff = half * kFineTileRows * kSP;  // this half's rows in a staged tile
  for (int p = p0, i = 0; p < p1; ++p, ++i) {
    cp_async_wait<1>();  // pair p's chunk has landed (p + 1's may still be in flight)
    __syncthreads();
    const int buf = i % 3;
    if (p + 2 < p1) load_k(chunkN, buf == 0 ? 2 : buf - 1);
    cp_async_commit();
    if (p + 3 < p1) chunkN = CH[p + 3];
    // This pair's entries (stored at the next pair) and the next pair's bounds.
    uint32_t rcA[kE];
    int32_t posA[NP];
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      const int j = gA0 + 32 * e + lane;
      rcA[e] = j < gA1 ? RC[j] : 0u;
      if constexpr (!TILE) posA[e] = j < gA1 ? POS[j] : 0;
    }
    if constexpr (TILE) posA[0] = 0;
    int gB0 = 0, gB1 = 0;
    if (p + 1 < p1) {
      gB0 = SB[((p + 1) * 8 + warp) * 2];
      gB1 = SB[((p + 1) * 8 + warp) * 2 + 1];
    }
    if constexpr (QREG) {
      if (i == 0) {  // Q landed with the first chunk: its fragments into registers once
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
          for (int kk = 0; kk < NQ; ++kk) ldmatrix_x4(qf[mt][kk], sQ + mt * 16 * pitch + qoff + kk * 16);
      }
    }
    // The previous pair's entries: its S tile was staged before this barrier.
    if (i > 0) store(gZ0, gZ1, rcZ, posZ, sS + ((i - 1) & 1) * kSuperRows * kSP + hoff);
    // ---- S = Q K^T: 64 rows x this warp's 16 keys ----
    const T* kb = sK + buf * kFineChunkKeys * pitch;
    float acc[4][2][4];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;
    if constexpr (QREG) {
#pragma unroll
      for (int kk = 0; kk < NQ; ++kk) {
        uint32_t bf[4];
        ldmatrix_x4(bf, kb + koff + kk * 16);
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
          mma16816<kIsBf16<T>>(acc[mt][0], qf[mt][kk], bf[0], bf[1]);
          mma16816<kIsBf16<T>>(acc[mt][1], qf[mt][kk], bf[2], bf[3]);
        }
      }
    } else {
      for (int k0 = 0; k0 < D; k0 += 16) {
        uint32_t bf[4];
        ldmatrix_x4(bf, kb + koff + k0);
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
          uint32_t af[4];
          ldmatrix_x4(af, sQ + mt * 16 * pitch + qoff + k0);
          mma16816<kIsBf16<T>>(acc[mt][0], af, bf[0], bf[1]);
          mma16816<kIsBf16<T>>(acc[mt][1], af, bf[2], bf[3]);
        }
      }
    }
    T* st = sS + (i & 1) * kSuperRows * kSP + hoff;
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int r = mt * 16 + lane / 4, c = wq * 16 + nt * 8 + 2 * (lane % 4);
        T v0[2] = {Num<T>::from(acc[mt][nt][0]), Num<T>::from(acc[mt][nt][1])};
        T v1[2] = {Num<T>::from(acc[mt][nt][2]), Num<T>::from(acc[mt][nt][3])};
        *reinterpret_cast<uint32_t*>(st + r * kSP + c) = *reinterpret_cast<uint32_t*>(v0);
        *reinterpret_cast<uint32_t*>(st + (r + 8) * kSP + c) = *reinterpret_cast<uint32_t*>(v1);
      }
    gZ0 = gA0;
    gZ1 = gA1;
#pragma unroll
    for (int e = 0; e < kE; ++e) rcZ[e] = rcA[e];
#pragma unroll
    for (int e = 0; e < NP; ++e) posZ[e] = posA[e];
    gA0 = gB0;
    gA1 = gB1;
  }
  __syncthreads();  // the last pair's S tile
  store(gZ0, gZ1, rcZ, posZ, sS + ((p1 - p0 - 1) & 1) * kSuperRows * kSP + hoff);
}

template <class T, bool TILE, bool EXP>
__global__ void __launch_bounds__(256, 2) spmm_fine_tc_kernel(const SpmmFineTc::Arguments a) {
  constexpr int NP = TILE ? 1 : kE;
  constexpr int VT = kFineChunkKeys * kSP, PT = kSuperRows * kSP;  // a V chunk, a 128 x 64 P tile
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sV = reinterpret_cast<T*>(smem_raw);  // [3][64][kSP]
  T* sP = sV + 3 * VT;                      // [2][128][kSP]
  __shared__ float sL[EXP ? kSuperRows : 1];

  const int tile = blockIdx.x;
  const int64_t bh = blockIdx.y;
  const int dv0 = blockIdx.z * 64;
  const int64_t b = bh / a.shape.Hq, h = bh % a.shape.Hq, hk = h / (a.shape.Hq / a.shape.Hkv);
  const T* Vg = static_cast<const T*>(a.v.data) + b * a.v.sb + hk * a.v.sh;
  const T* Pg = static_cast<const T*>(a.p) + bh * a.nnz;
  const int Dv = int(a.shape.Dv);
  const int p0 = a.tiles.super_pairs[tile], p1 = a.tiles.super_pairs[tile + 1];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, half = warp / 4, wq = warp % 4;
  const int32_t* SB = a.tiles.sp_bounds;
  const uint16_t* RC = a.tiles.rc;
  const int32_t* POS = a.tiles.pos;
  const int32_t* CH = a.tiles.sp_chunk;
  for (int i = threadIdx.x; i < 2 * PT / 8; i += 256) reinterpret_cast<uint4*>(sP)[i] = make_uint4(0, 0, 0, 0);
  const float sl2 = a.sl2;
  // A V chunk (64 keys x 64 value columns): two 16-byte copies a thread, rows vr0 and vr0 + 32, addresses
  // set up once here (the generic loop cost ~80 instructions a thread per pair).
  const int vr0 = int(threadIdx.x) / 8, vc0 = int(threadIdx.x) % 8;
  const bool vcol = dv0 + vc0 * 8 < Dv;
  const T* vsrc = Vg + vr0 * a.v.sl + dv0 + vc0 * 8;
  const uint32_t vdst = smem_u32(sV + vr0 * kSP + vc0 * 8);
  const int64_t vchunk = kFineChunkKeys * a.v.sl, vstep = 32 * a.v.sl;
  static_assert(kFineChunkKeys * 8 == 2 * 256, "two copies a thread per V chunk");
  const int nfull = int(a.shape.Lk / kFineChunkKeys), lastrows = int(a.shape.Lk % kFineChunkKeys);
  auto load_v = [&](int chunk, int buf) {
    const int nr = chunk < nfull ? kFineChunkKeys : lastrows;
    const T* src = vsrc + chunk * vchunk;
    const uint32_t dst = vdst + buf * (VT * 2);
#pragma unroll
    for (int l = 0; l < 2; ++l) {
      const bool ok = vcol && vr0 + 32 * l < nr;
      cp_async16(dst + l * 32 * kSP * 2, ok ? src + l * vstep : Vg, ok ? 16 : 0);
    }
  };
  auto bounds = [&](int p, int& g0, int& g1) {
    g0 = g1 = 0;
    if (p < p1) {
      g0 = SB[(p * 8 + warp) * 2];
      g1 = SB[(p * 8 + warp) * 2 + 1];
    }
  };
  // Entries are held as byte offsets in a P tile (this half's rows, pitch kSP), computed once as they are
  // loaded and used by the clear and the scatter; slots past a group's end hold kPadOff, the padding column
  // of the half's first row (ldmatrix reads columns 0..63 only), so neither needs a predicate: their
  // 16-bit shared stores go out unconditionally, at 32-bit shared addresses.
  const uint32_t hoff = half * kFineTileRows * kSP * 2, kPadOff = hoff + kFineChunkKeys * 2;
  const uint32_t sP32 = smem_u32(sP);
  auto place = [&](uint32_t rc) -> uint32_t { return hoff + ((rc >> 6) * kSP + (rc & 63)) * 2; };
  auto st16 = [](uint32_t addr, T v) { st_shared_b16(addr, *reinterpret_cast<const unsigned short*>(&v)); };
  // Entry values as stored (P, or S with EXP) and as they go into the tile.
  auto to_p = [&](T v, uint32_t off) -> T {
    if constexpr (EXP) return Num<T>::from(exp2f(Num<T>::to(v) * sl2 - sL[off / (2 * kSP)]));
    else return v;
  };
  auto load_pos = [&](int g0, int g1, int32_t (&pos)[NP]) {
#pragma unroll
    for (int e = 0; e < NP; ++e) {
      const int j = g0 + 32 * e + lane;
      pos[e] = !TILE && j < g1 ? POS[j] : 0;
    }
  };
  auto load_entries = [&](int g0, int g1, const int32_t (&pos)[NP], uint32_t (&off)[kE], T (&v)[kE]) {
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      const int j = g0 + 32 * e + lane;
      off[e] = kPadOff;
      v[e] = Num<T>::from(0.f);
      if (j < g1) {
        off[e] = place(RC[j]);
        v[e] = Pg[TILE ? j : pos[TILE ? 0 : e]];
      }
    }
  };
  auto clear = [&](int g0, int g1, const uint32_t (&off)[kE], uint32_t pt) {
    const T zero = Num<T>::from(0.f);
#pragma unroll
    for (int e = 0; e < kE; ++e) st16(pt + off[e], zero);
    for (int j = g0 + 32 * kE + lane; j < g1; j += 32) st16(pt + place(RC[j]), zero);
  };
  auto scatter = [&](int g0, int g1, const uint32_t (&off)[kE], const T (&v)[kE], uint32_t pt) {
#pragma unroll
    for (int e = 0; e < kE; ++e) st16(pt + off[e], to_p(v[e], off[e]));
    for (int j = g0 + 32 * kE + lane; j < g1; j += 32) {  // a crowded group: the rest straight from L2
      const uint32_t o = place(RC[j]);
      st16(pt + o, to_p(Pg[TILE ? j : POS[j]], o));
    }
  };

  float acc[2][4][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;
  const int wr = half * kFineTileRows + (wq / 2) * 32, wc = (wq % 2) * 32;  // this warp's rows and value columns

  // At the top of pair p: Z = pair p - 1 (cleared now), A = p, B = p + 1 (scattered now, values held),
  // C = p + 2 (CSR places held; places and values loaded now), D = p + 3 (bounds; CSR places loaded now).
  int gZ0 = 0, gZ1 = 0, gA0, gA1, gB0, gB1, gC0, gC1, gD0, gD1;
  uint32_t rcZ[kE], rcA[kE], rcB[kE];
  T vA[kE], vB[kE];
  int32_t posA[NP], posB[NP], posC[NP];
#pragma unroll
  for (int e = 0; e < kE; ++e) rcZ[e] = kPadOff;
  int chunkN = 0;
  if (p0 < p1) {
    load_v(CH[p0], 0);
    cp_async_commit();
    if (p0 + 1 < p1) load_v(CH[p0 + 1], 1);
    cp_async_commit();
    if (p0 + 2 < p1) chunkN = CH[p0 + 2];
    bounds(p0, gA0, gA1);
    bounds(p0 + 1, gB0, gB1);
    bounds(p0 + 2, gC0, gC1);
    bounds(p0 + 3, gD0, gD1);
    load_pos(gA0, gA1, posA);
    load_pos(gB0, gB1, posB);
    load_pos(gC0, gC1, posC);
  }
  // Up to here only the plan and V (PDL: overlapping the softmax's tail); P / S and lse2 are the softmax's.
  pdl_wait();
  if constexpr (EXP) {
    if (threadIdx.x < kSuperRows) {
      const int64_t q = int64_t(tile) * kSuperRows + threadIdx.x;
      sL[threadIdx.x] = q < a.shape.Lq ? a.lse2[bh * a.shape.Lq + q] : CUDART_INF_F;
    }
  }
  if (p0 < p1) {
    load_entries(gA0, gA1, posA, rcA, vA);
    load_entries(gB0, gB1, posB, rcB, vB);
  }
  __syncthreads();  // the zeroed tiles and sL
  if (p0 < p1) scatter(gA0, gA1, rcA, vA, sP32);

  for (int p = p0, i = 0; p < p1; ++p, ++i) {
    cp_async_wait<1>();  // pair p's chunk has landed (p + 1's may still be in flight)
    __syncthreads();     // ... for every thread, and P of pair p is in its tile
    const int buf = i % 3;
    if (p + 2 < p1) load_v(chunkN, buf == 0 ? 2 : buf - 1);
    cp_async_commit();
    if (p + 3 < p1) chunkN = CH[p + 3];
    uint32_t rcC[kE];
    T vC[kE];
    load_entries(gC0, gC1, posC, rcC, vC);
    int32_t posD[NP];
    load_pos(gD0, gD1, posD);
    int gE0, gE1;
    bounds(p + 4, gE0, gE1);
    if (p + 1 < p1) {  // the other tile: clear pair p - 1's entries, put pair p + 1's
      const uint32_t pt = sP32 + ((i + 1) & 1) * (PT * 2);
      clear(gZ0, gZ1, rcZ, pt);
      __syncwarp();
      scatter(gB0, gB1, rcB, vB, pt);
    }
    // ---- O += P V: this warp's 32 rows x 32 value columns ----
    const T* pt = sP + (i & 1) * PT;
    const T* vb = sV + buf * VT;
#pragma unroll
    for (int kk = 0; kk < kFineChunkKeys / 16; ++kk) {
      uint32_t af[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
        ldmatrix_x4(af[mt], pt + (wr + mt * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kSP + kk * 16 + (lane / 16) * 8);
#pragma unroll
      for (int ng = 0; ng < 2; ++ng) {
        uint32_t bf[4];
        ldmatrix_x4_trans(bf, vb + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kSP + wc + ng * 16 + (lane / 16) * 8);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma16816<kIsBf16<T>>(acc[mt][2 * ng], af[mt], bf[0], bf[1]);
          mma16816<kIsBf16<T>>(acc[mt][2 * ng + 1], af[mt], bf[2], bf[3]);
        }
      }
    }
    gZ0 = gA0; gZ1 = gA1;
    gA0 = gB0; gA1 = gB1;
    gB0 = gC0; gB1 = gC1;
    gC0 = gD0; gC1 = gD1;
    gD0 = gE0; gD1 = gE1;
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      rcZ[e] = rcA[e];
      rcA[e] = rcB[e];
      rcB[e] = rcC[e];
      vB[e] = vC[e];
    }
#pragma unroll
    for (int e = 0; e < NP; ++e) posC[e] = posD[e];
  }
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h8 = 0; h8 < 2; ++h8) {
      const int64_t q = int64_t(tile) * kSuperRows + wr + mt * 16 + lane / 4 + h8 * 8;
      if (q >= a.shape.Lq) continue;
      T* orow = static_cast<T*>(const_cast<void*>(a.o.data)) + b * a.o.sb + q * a.o.sl + h * a.o.sh;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int c = dv0 + wc + nt * 8 + 2 * (lane % 4);
        if (c >= Dv) continue;
        T pair[2] = {Num<T>::from(acc[mt][nt][h8 * 2]), Num<T>::from(acc[mt][nt][h8 * 2 + 1])};
        *reinterpret_cast<uint32_t*>(orow + c) = *reinterpret_cast<uint32_t*>(pair);
      }
    }
}

Status check_common(const Shape& sh, const FineTiles& t) {
  if (Status s = check_shape(sh); !s) return s;
  if (sh.dtype != DType::bf16 && sh.dtype != DType::f16)
    return Status::fail("fine tensor-core path: dtype " + std::string(dtype_name(sh.dtype)) + " is not bf16 or f16");
  if (sh.bh() > 65535) return Status::fail("batch * q_heads " + std::to_string(sh.bh()) + " > 65535");
  if (t.npairs > 0 && (!t.tile_pairs || !t.pair_chunk || !t.groups || !t.pos || !t.rc || !t.super_pairs ||
                       !t.sp_chunk || !t.sp_bounds))
    return Status::fail("null fine tile metadata");
  if (t.nsuper != (t.ntiles + 1) / 2) return Status::fail("fine super-tiles do not cover the tiles");
  return Status::success();
}

}  // namespace

Status SddmmFineTc::can_implement(const Arguments& a) {
  if (Status s = check_common(a.shape, a.tiles); !s) return s;
  if (a.shape.D % 16 != 0 || a.shape.D > 256)
    return Status::fail("head dim " + std::to_string(a.shape.D) + " is not a multiple of 16 up to 256");
  if (Status s = check_dense(a.q, a.shape.D, a.shape.dtype, "q"); !s) return s;
  if (Status s = check_dense(a.k, a.shape.D, a.shape.dtype, "k"); !s) return s;
  if (a.nitems > 0 && (!a.items || !a.s)) return Status::fail("null items or output pointer");
  return Status::success();
}

void SddmmFineTc::run(const Arguments& a, cudaStream_t stream) {
  require(can_implement(a), "SddmmFineTc");
  if (a.nitems == 0) return;
  const size_t smem = (size_t(kSuperRows + 3 * kFineChunkKeys) * (a.shape.D + 8) + 2 * kSuperRows * kSP) * 2;
  dim3 grid(grid_dim(a.nitems, "sddmm fine tc items"), unsigned(a.shape.bh()));
  auto go = [&](auto kernel) {
    if (smem > 48 * 1024)
      SPATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    kernel<<<grid, 256, smem, stream>>>(a);
  };
  auto pick = [&](auto t, auto tile) {
    using T = decltype(t);
    constexpr bool TILE = decltype(tile)::value;
    switch (a.shape.D) {
      case 32: go(sddmm_fine_tc_kernel<T, 32, TILE>); break;
      case 64: go(sddmm_fine_tc_kernel<T, 64, TILE>); break;
      case 128: go(sddmm_fine_tc_kernel<T, 128, TILE>); break;
      default: go(sddmm_fine_tc_kernel<T, 0, TILE>); break;
    }
  };
  auto order = [&](auto t) {
    if (a.tile_order) pick(t, std::true_type{});
    else pick(t, std::false_type{});
  };
  if (a.shape.dtype == DType::bf16) order(__nv_bfloat16{});
  else order(__half{});
  SPATTN_LAUNCH_CHECK("sddmm_fine_tc_kernel");
}

Status SpmmFineTc::can_implement(const Arguments& a) {
  if (Status s = check_common(a.shape, a.tiles); !s) return s;
  if (a.shape.Dv % 8 != 0 || a.shape.Dv > 256)
    return Status::fail("value dim " + std::to_string(a.shape.Dv) + " is not a multiple of 8 up to 256");
  if (Status s = check_dense(a.v, a.shape.Dv, a.shape.dtype, "v"); !s) return s;
  if (Status s = check_dense(a.o, a.shape.Dv, a.shape.dtype, "o"); !s) return s;
  if (a.nnz > 0 && !a.p) return Status::fail("p fine is null");
  if (a.tiles.ntiles > 0 && !a.tiles.super_pairs) return Status::fail("null fine tile metadata");
  return Status::success();
}

void SpmmFineTc::run(const Arguments& a, cudaStream_t stream) {
  require(can_implement(a), "SpmmFineTc");
  if (a.tiles.ntiles == 0) return;
  dim3 grid(grid_dim(a.tiles.nsuper, "spmm fine tc tiles"), unsigned(a.shape.bh()), unsigned((a.shape.Dv + 63) / 64));
  const size_t smem = size_t(3 * kFineChunkKeys + 2 * kSuperRows) * kSP * 2;
  auto go = [&](auto kernel) {
    SPATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    cuda::launch_pdl(a.pdl, kernel, grid, dim3(256), smem, stream, a);
  };
  auto pick = [&](auto t) {
    using T = decltype(t);
    if (a.tile_order && a.lse2) go(spmm_fine_tc_kernel<T, true, true>);
    else if (a.tile_order) go(spmm_fine_tc_kernel<T, true, false>);
    else if (a.lse2) go(spmm_fine_tc_kernel<T, false, true>);
    else go(spmm_fine_tc_kernel<T, false, false>);
  };
  if (a.shape.dtype == DType::bf16) pick(__nv_bfloat16{});
  else pick(__half{});
  SPATTN_LAUNCH_CHECK("spmm_fine_tc_kernel");
}

}  // namespace spattn::unfused::detail
