// cuda/runtime/tile_lists.cu — see tile_lists.hpp.
#include <cuda_runtime.h>

#include "cuda/runtime/tile_lists.hpp"
#include "cuda/runtime/tile_walk.hpp"

namespace spattn::cuda::runtime {
namespace {

constexpr int kListThreads = 1024;
constexpr int kMaskThreads = 256;

// One CTA's lists of q_tiles query tiles: count(qt) entries each, scanned into row_offsets[0 .. q_tiles] (from
// `base`, at most `capacity` past it), then emit(qt, at, room) writes tile qt's entries at entries + at.
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
      [&](int qt, int64_t at, int64_t) { walk(a, qt, reinterpret_cast<Entry4*>(a.entries) + at, at); });
}

// A CTA a query tile: the bitmasks of its bitmask entries, a word a thread per step.
__global__ void __launch_bounds__(kMaskThreads) document_masks(DocTileArgs a) {
  const int qt = blockIdx.x;
  const int64_t e0 = a.row_offsets[qt], e1 = a.row_offsets[qt + 1];
  const int words = a.block_m * a.block_n / 64;
  const Entry4* entries = reinterpret_cast<const Entry4*>(a.entries);
  for (int64_t e = e0; e < e1; ++e) {
    const Entry4 v = entries[e];
    if (v.y < 0) continue;
    unsigned long long* m = a.masks + int64_t(v.y) * words;
    for (int w = threadIdx.x; w < words; w += blockDim.x) m[w] = doc_mask_word(a, qt, v.x, w);
  }
}

// ---- the backward's key-major lists of documents (a.q_tiles: key tiles; a.block_m: 64-row query tiles) ----
__global__ void __launch_bounds__(kListThreads) document_key_lists(DocTileArgs a) {
  scan_lists(
      a.q_tiles, 0, a.entry_capacity, a.row_offsets, [&](int kt) { return walk(a, kt, nullptr, 0, true); },
      [&](int kt, int64_t at, int64_t) { walk(a, kt, reinterpret_cast<Entry4*>(a.entries) + at, at, true); });
}

// A CTA a key tile: its bitmask entries' transposed words, one a key (bit r: query q0 + r).
__global__ void __launch_bounds__(kMaskThreads) document_key_masks(DocTileArgs a) {
  const int kt = blockIdx.x;
  const int64_t e0 = a.row_offsets[kt], e1 = a.row_offsets[kt + 1];
  const Entry4* entries = reinterpret_cast<const Entry4*>(a.entries);
  for (int64_t e = e0; e < e1; ++e) {
    const Entry4 v = entries[e];
    if (v.y < 0) continue;
    for (int c = threadIdx.x; c < a.block_n; c += blockDim.x)
      a.masks[int64_t(v.y) * a.block_n + c] = doc_key_mask_word(a, kt, v.x, c);
  }
}

// A CTA a list: its tiles' entries (ascending by an insertion sort of each tile's few), scanned into its row offsets.
__global__ void __launch_bounds__(kListThreads) block_lists(BlockTileArgs a) {
  const int l = blockIdx.x, bb = l / a.heads, hh = l % a.heads;
  Entry4* entries = reinterpret_cast<Entry4*>(a.entries);
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
          Entry4 v;
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
