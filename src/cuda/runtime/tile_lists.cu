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

// Walks query tile qt's key tiles in ascending order; writes them at out (entry index first ...) where out is not null.
// Returns how many there are.
__device__ int64_t walk(const DocTileArgs& a, int qt, int4* out, int64_t first) {
  const int64_t q0 = int64_t(qt) * a.block_m, q1 = min(q0 + a.block_m, int64_t(a.q_len));
  int64_t n = 0, last = -1;
  for (int d = first_doc_after(a, q0); d < a.documents; ++d) {
    const int64_t c0 = boundary(a, d), c1 = boundary(a, d + 1);
    if (c0 >= q1) break;
    const int64_t qa = max(q0, c0), qb = min(q1, c1);
    if (qa >= qb) continue;
    const int64_t ka = max(max(c0, qa + a.lo), int64_t(0)), kb = min(min(c1, qb + a.hi), int64_t(a.k_len));  // [ka, kb)
    if (ka >= kb) continue;
    const bool one_doc_rows = c0 <= q0 && q1 <= c1;
    for (int64_t kt = ka / a.block_n; kt <= (kb - 1) / a.block_n; ++kt) {
      if (kt == last) continue;  // a key tile shared with the previous document (then a bitmask)
      last = kt;
      if (out) {
        const int64_t e = first + n;
        if (e >= a.entry_capacity) return n;
        const int64_t k0 = kt * a.block_n, k1 = min(k0 + a.block_n, int64_t(a.k_len));
        int4 v;
        v.x = int(kt);
        v.z = a.lo;
        v.w = a.hi;
        if (one_doc_rows && c0 <= k0 && k1 <= c1)
          v.y = (k0 - (q1 - 1) >= a.lo && (k1 - 1) - q0 <= a.hi) ? -1 : -2;  // kFull : kBand
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

// ---- block masks ----
__device__ __forceinline__ int64_t load_index(const void* p, int bits, int64_t off) {
  return bits == 32 ? int64_t(static_cast<const int*>(p)[off]) : int64_t(static_cast<const long long*>(p)[off]);
}

// The entry type of key tile kt for query tile qt: -1 kFull, -2 kBand, 0 none (out of range, or a partial block the
// band misses).
__device__ int block_entry(const BlockTileArgs& a, int qt, int64_t kt, bool full) {
  if (kt < 0 || kt >= a.k_tiles) return 0;
  if (full || !a.band) return -1;
  const int64_t q0 = int64_t(qt) * a.block_m, q1 = min(q0 + a.block_m, int64_t(a.q_len));
  const int64_t k0 = kt * a.block_n, k1 = min(k0 + a.block_n, int64_t(a.k_len));
  if (k0 - (q1 - 1) > a.hi || (k1 - 1) - q0 < a.lo) return 0;
  return (k0 - (q1 - 1) >= a.lo && (k1 - 1) - q0 <= a.hi) ? -1 : -2;
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
          v.x = int(kt), v.y = type, v.z = a.lo, v.w = a.hi;
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

int launch_document_tiles(const DocTileArgs& a, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (a.q_tiles == 0) return int(cudaSuccess);
  document_lists<<<1, kListThreads, 0, s>>>(a);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return int(e);
  document_masks<<<a.q_tiles, kMaskThreads, 0, s>>>(a);
  return int(cudaGetLastError());
}

}  // namespace spattn::cuda::runtime
