// cuda/runtime/tile_lists.cu — see tile_lists.hpp.
#include <cuda_runtime.h>

#include "cuda/runtime/tile_lists.hpp"

namespace spattn::cuda::runtime {
namespace {

constexpr int kListThreads = 1024;
constexpr int kMaskThreads = 256;

__device__ __forceinline__ int64_t boundary(const DocTileArgs& a, int i) {
  return a.cu_bits == 32 ? int64_t(static_cast<const int*>(a.cu)[i * a.cu_stride])
                         : int64_t(static_cast<const long long*>(a.cu)[i * a.cu_stride]);
}

// The first document d with cu[d + 1] > x (n where none): the one that holds x if any, else the next.
__device__ int first_doc_after(const DocTileArgs& a, int64_t x) {
  int lo = 0, hi = a.documents;  // answer in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (boundary(a, mid + 1) > x) hi = mid; else lo = mid + 1;
  }
  return lo;
}

// kFull (-1) where the band keeps every pair of the tile [q0, q1) x [k0, k1) and every key of the tile is in range
// (the kernels run full tiles unmasked: a tile past k_len is never full), else kBand (-2: the kernels mask by the
// band and by the valid keys).
__device__ __forceinline__ int full_or_band(const DocTileArgs& a, int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
  return (k1 - k0 == a.block_n && k0 - (q1 - 1) >= a.lo && (k1 - 1) - q0 <= a.hi) ? -1 : -2;
}

// Walks tile t's partner tiles in ascending order: the key tiles of query tile t, or (keys: the backward's key-major
// lists) the 64-row query tiles of key tile t. Writes them at out (entry index first ...) where out is not null;
// returns how many there are.
__device__ int64_t walk(const DocTileArgs& a, int t, int4* out, int64_t first, bool keys = false) {
  const int os = keys ? a.block_n : a.block_m, is = keys ? a.block_m : a.block_n;  // outer and inner tile sizes
  const int64_t olen = keys ? a.k_len : a.q_len, ilen = keys ? a.q_len : a.k_len;
  const int64_t dlo = keys ? -int64_t(a.hi) : a.lo, dhi = keys ? -int64_t(a.lo) : a.hi;  // inner - outer in the band
  const int64_t o0 = int64_t(t) * os, o1 = min(o0 + os, olen);
  int64_t n = 0, last = -1;
  for (int d = first_doc_after(a, o0); d < a.documents; ++d) {
    const int64_t c0 = boundary(a, d), c1 = boundary(a, d + 1);
    if (c0 >= o1) break;
    const int64_t oa = max(o0, c0), ob = min(o1, c1);
    if (oa >= ob) continue;
    const int64_t ia = max(max(c0, oa + dlo), int64_t(0)), ib = min(min(c1, ob + dhi), ilen);  // [ia, ib)
    if (ia >= ib) continue;
    const bool one_doc_outer = c0 <= o0 && o1 <= c1;
    for (int64_t it = ia / is; it <= (ib - 1) / is; ++it) {
      if (it == last) continue;  // a tile shared with the previous document (then a bitmask)
      last = it;
      if (out) {
        const int64_t e = first + n;
        if (e >= a.entry_capacity) return n;
        const int64_t i0 = it * is, i1 = min(i0 + is, ilen);
        int4 v;
        v.x = int(it);
        v.z = a.lo;
        v.w = a.hi;
        if (one_doc_outer && c0 <= i0 && i1 <= c1)
          v.y = keys ? full_or_band(a, i0, i1, o0, o1) : full_or_band(a, o0, o1, i0, i1);
        else
          v.y = int(e);  // bitmask: its own index
        out[n] = v;
      }
      ++n;
    }
  }
  return n;
}

// One CTA's lists of q_tiles query tiles: count(qt) entries each, scanned into row_offsets[0 .. q_tiles] (from
// `base`, at most `capacity` past it), then emit(qt, out, at) writes tile qt's entries at entries + at.
template <class Count, class Emit>
__device__ void scan_lists(int q_tiles, int64_t base, int64_t capacity, int64_t* row_offsets, Count count, Emit emit) {
  __shared__ int64_t sums[kListThreads];
  const int t = threadIdx.x;
  const int per = (q_tiles + kListThreads - 1) / kListThreads;
  const int t0 = min(t * per, q_tiles), t1 = min(t0 + per, q_tiles);
  int64_t mine = 0;
  for (int qt = t0; qt < t1; ++qt) mine += count(qt);
  sums[t] = mine;
  __syncthreads();
  for (int s = 1; s < kListThreads; s *= 2) {  // inclusive scan (Hillis-Steele)
    const int64_t add = t >= s ? sums[t - s] : 0;
    __syncthreads();
    sums[t] += add;
    __syncthreads();
  }
  int64_t at = sums[t] - mine;
  for (int qt = t0; qt < t1; ++qt) {
    row_offsets[qt] = base + min(at, capacity);
    if (at < capacity) emit(qt, base + at, capacity - at);
    at += count(qt);
  }
  if (t == kListThreads - 1) row_offsets[q_tiles] = base + min(sums[t], capacity);
}

// One CTA: counts every query tile's entries, scans them into row_offsets, writes the entries.
__global__ void __launch_bounds__(kListThreads) document_lists(DocTileArgs a) {
  scan_lists(
      a.q_tiles, 0, a.entry_capacity, a.row_offsets, [&](int qt) { return walk(a, qt, nullptr, 0); },
      [&](int qt, int64_t at, int64_t) { walk(a, qt, reinterpret_cast<int4*>(a.entries) + at, at); });
}

// A CTA a query tile: the bitmasks of its bitmask entries, a word a thread per step.
__global__ void __launch_bounds__(kMaskThreads) document_masks(DocTileArgs a) {
  const int qt = blockIdx.x;
  const int64_t e0 = a.row_offsets[qt], e1 = a.row_offsets[qt + 1];
  const int words = a.block_m * a.block_n / 64;
  const int4* entries = reinterpret_cast<const int4*>(a.entries);
  for (int64_t e = e0; e < e1; ++e) {
    const int4 v = entries[e];
    if (v.y < 0) continue;
    unsigned long long* m = a.masks + int64_t(v.y) * words;
    for (int w = threadIdx.x; w < words; w += blockDim.x) {
      const int r = w * 64 / a.block_n, c0 = w * 64 % a.block_n;
      const int64_t q = int64_t(qt) * a.block_m + r, k0 = int64_t(v.x) * a.block_n + c0;
      unsigned long long bits = 0;
      if (q < a.q_len) {
        const int d = first_doc_after(a, q);
        if (d < a.documents && boundary(a, d) <= q) {
          const int64_t lo = max(boundary(a, d), q + a.lo), hi = min(min(boundary(a, d + 1), q + a.hi + 1), int64_t(a.k_len));
          for (int c = 0; c < 64; ++c) {
            const int64_t k = k0 + c;
            if (k >= lo && k < hi) bits |= 1ull << c;
          }
        }
      }
      m[w] = bits;
    }
  }
}

// ---- the backward's key-major lists of documents (a.q_tiles: key tiles; a.block_m: 64-row query tiles) ----
__global__ void __launch_bounds__(kListThreads) document_key_lists(DocTileArgs a) {
  scan_lists(
      a.q_tiles, 0, a.entry_capacity, a.row_offsets, [&](int kt) { return walk(a, kt, nullptr, 0, true); },
      [&](int kt, int64_t at, int64_t) { walk(a, kt, reinterpret_cast<int4*>(a.entries) + at, at, true); });
}

// A CTA a key tile: its bitmask entries' transposed words, one a key (bit r: query q0 + r).
__global__ void __launch_bounds__(kMaskThreads) document_key_masks(DocTileArgs a) {
  const int kt = blockIdx.x;
  const int64_t e0 = a.row_offsets[kt], e1 = a.row_offsets[kt + 1];
  const int4* entries = reinterpret_cast<const int4*>(a.entries);
  for (int64_t e = e0; e < e1; ++e) {
    const int4 v = entries[e];
    if (v.y < 0) continue;
    for (int c = threadIdx.x; c < a.block_n; c += blockDim.x) {
      const int64_t k = int64_t(kt) * a.block_n + c, q0 = int64_t(v.x) * a.block_m;
      unsigned long long bits = 0;
      if (k < a.k_len) {
        const int d = first_doc_after(a, k);
        if (d < a.documents && boundary(a, d) <= k) {
          // the document's queries whose band holds k: [k - hi, k - lo], clipped to the tile and to q_len
          const int64_t qa = max(max(boundary(a, d), k - a.hi), q0);
          const int64_t qb = min(min(min(boundary(a, d + 1), k - a.lo + 1), q0 + 64), int64_t(a.q_len));
          if (qa < qb) {
            const int w = int(qb - qa), r = int(qa - q0);
            bits = (w >= 64 ? ~0ull : ((1ull << w) - 1)) << r;
          }
        }
      }
      a.masks[int64_t(v.y) * a.block_n + c] = bits;
    }
  }
}

// ---- block masks ----
__device__ __forceinline__ int64_t load_index(const void* p, int bits, int64_t off) {
  return bits == 32 ? int64_t(static_cast<const int*>(p)[off]) : int64_t(static_cast<const long long*>(p)[off]);
}

// The entry type of key tile kt for query tile qt: -1 kFull, -2 kBand by the spec's band, -3 kBand over every pair (a
// tile kept whole whose keys run past k_len: the kernels run full tiles unmasked), 0 none (out of range, or a partial
// block the band misses).
__device__ int block_entry(const BlockTileArgs& a, int qt, int64_t kt, bool full) {
  if (kt < 0 || kt >= a.k_tiles) return 0;
  const int64_t q0 = int64_t(qt) * a.block_m, q1 = min(q0 + a.block_m, int64_t(a.q_len));
  const int64_t k0 = kt * a.block_n, k1 = min(k0 + a.block_n, int64_t(a.k_len));
  const bool whole = k1 - k0 == a.block_n;
  if (full || !a.band) return whole ? -1 : -3;
  if (k0 - (q1 - 1) > a.hi || (k1 - 1) - q0 < a.lo) return 0;
  return (whole && k0 - (q1 - 1) >= a.lo && (k1 - 1) - q0 <= a.hi) ? -1 : -2;
}

// Walks query tile qt's listed blocks of list (b', h'): partial, then full; f(kt, type) for each kept one.
template <class F>
__device__ void each_block(const BlockTileArgs& a, int bb, int hh, int qt, F f) {
  for (int full = 0; full < 2; ++full) {
    const void* num = full ? a.full_num : a.num;
    if (!num) continue;
    const int64_t* ns = full ? a.full_num_s : a.num_s;
    const int64_t* is = full ? a.full_idx_s : a.idx_s;
    const int cap = full ? a.full_cap : a.cap;
    const int64_t n = min(max(load_index(num, full ? a.full_num_bits : a.num_bits, bb * ns[0] + hh * ns[1] + qt * ns[2]),
                              int64_t(0)), int64_t(cap));
    const void* idx = full ? a.full_idx : a.idx;
    const int64_t row = bb * is[0] + hh * is[1] + qt * is[2];
    for (int64_t j = 0; j < n; ++j) {
      const int64_t kt = load_index(idx, full ? a.full_idx_bits : a.idx_bits, row + j * is[3]);
      const int type = block_entry(a, qt, kt, full);
      if (type) f(kt, type);
    }
  }
}

// A CTA a list: its tiles' entries (ascending by an insertion sort of each tile's few), scanned into its row offsets.
__global__ void __launch_bounds__(kListThreads) block_lists(BlockTileArgs a) {
  const int l = blockIdx.x, bb = l / a.heads, hh = l % a.heads;
  int4* entries = reinterpret_cast<int4*>(a.entries);
  scan_lists(
      a.q_tiles, int64_t(l) * a.list_capacity, a.list_capacity, a.row_offsets + int64_t(l) * (a.q_tiles + 1),
      [&](int qt) {
        int64_t n = 0;
        each_block(a, bb, hh, qt, [&](int64_t, int) { ++n; });
        return n;
      },
      [&](int qt, int64_t at, int64_t room) {
        int64_t n = 0;
        each_block(a, bb, hh, qt, [&](int64_t kt, int type) {
          if (n >= room) return;
          int4 v;
          v.x = int(kt), v.y = type == -3 ? -2 : type;
          v.z = type == -3 ? -(a.q_len + 1) : a.lo, v.w = type == -3 ? a.k_len + 1 : a.hi;
          int64_t i = n++;
          for (; i > 0 && entries[at + i - 1].x > v.x; --i) entries[at + i] = entries[at + i - 1];
          entries[at + i] = v;
        });
      });
}

}  // namespace

int launch_block_tiles(const BlockTileArgs& a, void* stream) {
  if (a.q_tiles == 0 || a.lists == 0) return int(cudaSuccess);
  block_lists<<<a.lists, kListThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  return int(cudaGetLastError());
}

int launch_document_key_tiles(const DocTileArgs& a, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (a.q_tiles == 0) return int(cudaSuccess);
  document_key_lists<<<1, kListThreads, 0, s>>>(a);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return int(e);
  document_key_masks<<<a.q_tiles, kMaskThreads, 0, s>>>(a);
  return int(cudaGetLastError());
}

int launch_document_tiles(const DocTileArgs& a, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (a.q_tiles == 0) return int(cudaSuccess);
  document_lists<<<1, kListThreads, 0, s>>>(a);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return int(e);
  document_masks<<<a.q_tiles, kMaskThreads, 0, s>>>(a);
  return int(cudaGetLastError());
}

}  // namespace spattn::cuda::runtime
