// cuda/runtime/document_tiles.cu — see document_tiles.hpp.
#include <cuda_runtime.h>

#include "cuda/runtime/document_tiles.hpp"

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

// One CTA: counts every query tile's entries, scans them into row_offsets, writes the entries.
__global__ void __launch_bounds__(kListThreads) document_lists(DocTileArgs a) {
  __shared__ int64_t sums[kListThreads];
  const int t = threadIdx.x;
  const int per = (a.q_tiles + kListThreads - 1) / kListThreads;
  const int t0 = min(t * per, a.q_tiles), t1 = min(t0 + per, a.q_tiles);
  int64_t mine = 0;
  for (int qt = t0; qt < t1; ++qt) mine += walk(a, qt, nullptr, 0);
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
    a.row_offsets[qt] = min(at, a.entry_capacity);
    at += walk(a, qt, reinterpret_cast<int4*>(a.entries) + at, at);
  }
  if (t == kListThreads - 1) a.row_offsets[a.q_tiles] = min(sums[t], a.entry_capacity);
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

}  // namespace

int launch_document_tiles(const DocTileArgs& a, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (a.q_tiles == 0) return int(cudaSuccess);
  document_lists<<<1, kListThreads, 0, s>>>(a);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return int(e);
  document_masks<<<a.q_tiles, kMaskThreads, 0, s>>>(a);
  return int(cudaGetLastError());
}

}  // namespace spattn::cuda::runtime
