// cuda/runtime/tile_lists.cu — see tile_lists.hpp.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
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
  auto rows = [&](int qt) {
    const int64_t q0 = int64_t(qt) * a.block_m;
    return q0 + a.block_m < a.q_len ? q0 + a.block_m : int64_t(a.q_len);
  };
  scan_lists(
      a.q_tiles, int64_t(l) * a.list_capacity, a.list_capacity, a.row_offsets + int64_t(l) * (a.q_tiles + 1),
      [&](int qt) {
        int64_t n = 0;
        each_block(a, bb, hh, qt, [&](int64_t kt, bool full) { n += block_entry(a, int64_t(qt) * a.block_m, rows(qt), kt, full) != 0; });
        return n;
      },
      [&](int qt, int64_t at, int64_t room) {
        int64_t n = 0;
        each_block(a, bb, hh, qt, [&](int64_t kt, bool full) {
          const int type = block_entry(a, int64_t(qt) * a.block_m, rows(qt), kt, full);
          if (!type || n >= room) return;
          const Entry4 v = block_entry4(a, kt, type);
          int64_t i = n++;
          for (; i > 0 && entries[at + i - 1].x > v.x; --i) entries[at + i] = entries[at + i - 1];
          entries[at + i] = v;
        });
      });
}

// The backward's key-major lists of a block mask: a CTA a list; per key tile (a key block), the 64-row query tiles of
// the query blocks that list it (each listed block stands for its `sub` query tiles), ascending. Counted into shared memory by
// atomics, scanned into the list's column offsets, placed by atomics, then each key tile's few sorted.
__global__ void __launch_bounds__(kListThreads) block_key_lists(BlockTileArgs a, int q_blocks, int sub) {
  extern __shared__ int cursor[];  // [k_tiles]
  const int l = blockIdx.x, bb = l / a.heads, hh = l % a.heads;
  const int64_t base = int64_t(l) * a.list_capacity;
  int64_t* offsets = a.row_offsets + int64_t(l) * (a.k_tiles + 1);
  Entry4* entries = reinterpret_cast<Entry4*>(a.entries);
  const int64_t per = int64_t(a.cap) + a.full_cap, items = int64_t(q_blocks) * per;
  // Item i: query block i / per, its (partial then full) listed block j; f(query tile, key tile, type) for each of
  // the block's 64-row query tiles the entry keeps pairs of.
  auto each_item = [&](auto f) {
    for (int64_t i = threadIdx.x; i < items; i += blockDim.x) {
      const int qb = int(i / per);
      const bool full = i % per >= a.cap;
      const int64_t j = full ? i % per - a.cap : i % per;
      if (j >= block_count(a, bb, hh, qb, full)) continue;
      const int64_t kt = block_index(a, bb, hh, qb, full, j);
      for (int h = 0; h < sub; ++h) {
        const int64_t qt = sub * int64_t(qb) + h, q0 = qt * 64;
        if (q0 >= a.q_len) break;
        const int type = block_entry(a, q0, q0 + 64 < a.q_len ? q0 + 64 : a.q_len, kt, full);
        if (type) f(qt, kt, type);
      }
    }
  };
  for (int kt = threadIdx.x; kt < a.k_tiles; kt += blockDim.x) cursor[kt] = 0;
  __syncthreads();
  each_item([&](int64_t, int64_t kt, int) { atomicAdd(&cursor[kt], 1); });
  __syncthreads();
  scan_lists(
      a.k_tiles, base, a.list_capacity, offsets, [&](int kt) { return int64_t(cursor[kt]); },
      [&](int, int64_t, int64_t) {});
  __syncthreads();
  for (int kt = threadIdx.x; kt < a.k_tiles; kt += blockDim.x) cursor[kt] = 0;
  __syncthreads();
  each_item([&](int64_t qt, int64_t kt, int type) {
    const int64_t at = offsets[kt] + atomicAdd(&cursor[kt], 1);
    if (at < offsets[kt + 1]) entries[at] = block_entry4(a, qt, type);
  });
  __syncthreads();
  for (int kt = threadIdx.x; kt < a.k_tiles; kt += blockDim.x) {  // ascending query tiles
    const int64_t e0 = offsets[kt], e1 = offsets[kt + 1];
    for (int64_t e = e0 + 1; e < e1; ++e) {
      const Entry4 v = entries[e];
      int64_t i = e;
      for (; i > e0 && entries[i - 1].x > v.x; --i) entries[i] = entries[i - 1];
      entries[i] = v;
    }
  }
}

// ---- block masks' lists built across the grid (launch_block_tiles_grid, launch_block_key_tiles_grid) ----
// kKeys: the backward's key-major lists (a row of marks a key tile, a bit a query block), else the forward's (a row a
// query tile, a bit a key tile); BlockKeyScratch::words words a row, two planes (partial, full) a list.
constexpr int kWarps = 4;  // warps a CTA: a warp a query block (marks) or a row (counts, entries)

// A warp a (list, query block): its listed blocks' marks (in range: block_entry drops the others too).
template <bool kKeys>
__global__ void __launch_bounds__(kWarps * 32) block_marks(BlockTileArgs a, int q_blocks, BlockKeyScratch s) {
  const int lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32, qb = t % q_blocks, l = t / q_blocks;
  if (l >= a.lists) return;
  const int bb = int(l / a.heads), hh = int(l % a.heads);
  for (int full = 0; full < 2; ++full) {
    const int64_t n = block_count(a, bb, hh, int(qb), full != 0);
    for (int64_t j = lane; j < n; j += 32) {
      const int64_t kt = block_index(a, bb, hh, int(qb), full != 0, j);
      if (kt < 0 || kt >= a.k_tiles) continue;
      if (kKeys)
        atomicOr(s.marks + block_mark_word(l, full != 0, kt, a.k_tiles, s.words, qb), 1u << (qb % 32));
      else
        atomicOr(s.marks + block_mark_word(l, full != 0, qb, q_blocks, s.words, kt), 1u << (kt % 32));
    }
  }
}

// Warp `t`'s row (list t / rows, row t % rows) of marks; the lane's run of its words, [w0, w1) (contiguous, so that
// the lanes' entries follow one another in the lanes' order).
template <bool kKeys>
struct MarkRow {
  int64_t l, r, w0, w1;
  unsigned *part, *full;
  __device__ MarkRow(const BlockTileArgs& a, const BlockKeyScratch& s, int64_t rows, int64_t t, int lane)
      : l(t / rows), r(t % rows) {
    const int64_t per = (s.words + 31) / 32;
    w0 = min(lane * per, s.words), w1 = min(w0 + per, s.words);
    part = s.marks + block_mark_word(l, false, r, rows, s.words, 0);
    full = s.marks + block_mark_word(l, true, r, rows, s.words, 0);
  }
  // The entries of the lane's words written at out (at most room; out null: counted).
  __device__ int64_t entries(const BlockTileArgs& a, int sub, Entry4* out, int64_t room) const {
    int64_t n = 0;
    for (int64_t w = w0; w < w1; ++w)
      n += kKeys ? key_word_entries(a, r, w, part[w], full[w], sub, out ? out + n : nullptr, room - n)
                 : row_word_entries(a, r, w, part[w], full[w], out ? out + n : nullptr, room - n);
    return n;
  }
};

// A warp a (list, row): its entries counted.
template <bool kKeys>
__global__ void __launch_bounds__(kWarps * 32) block_counts(BlockTileArgs a, int64_t rows, int sub, BlockKeyScratch s) {
  const int lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (t >= int64_t(a.lists) * rows) return;
  int64_t n = MarkRow<kKeys>(a, s, rows, t, lane).entries(a, sub, nullptr, 0);
  for (int o = 16; o; o /= 2) n += __shfl_xor_sync(~0u, n, o);
  if (lane == 0) s.counts[t] = int(n);
}

// A CTA a list: the counts scanned into its row offsets; where s.order is set, its rows ordered most entries first,
// ties ascending (a bitonic sort of key_order_key in shared memory; the identity past kMaxOrderedKeyTiles).
__global__ void __launch_bounds__(kListThreads) block_offsets(BlockTileArgs a, int rows, BlockKeyScratch s) {
  __shared__ unsigned long long keys[kMaxOrderedKeyTiles];
  const int64_t l = blockIdx.x;
  const int* counts = s.counts + l * rows;
  scan_lists(
      rows, l * a.list_capacity, a.list_capacity, a.row_offsets + l * (rows + 1),
      [&](int r) { return int64_t(counts[r]); }, [&](int, int64_t, int64_t) {});
  if (!s.order) return;
  int32_t* order = s.order + l * rows;
  if (rows > kMaxOrderedKeyTiles) {
    for (int r = threadIdx.x; r < rows; r += blockDim.x) order[r] = r;
    return;
  }
  int n = 1;
  while (n < rows) n *= 2;
  for (int i = threadIdx.x; i < n; i += blockDim.x) keys[i] = i < rows ? key_order_key(counts[i], i) : ~0ull;
  __syncthreads();
  for (int k = 2; k <= n; k *= 2)
    for (int j = k / 2; j > 0; j /= 2) {
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int p = i ^ j;
        if (p <= i) continue;
        const unsigned long long x = keys[i], y = keys[p];
        if ((x > y) == ((i & k) == 0)) keys[i] = y, keys[p] = x;
      }
      __syncthreads();
    }
  for (int i = threadIdx.x; i < rows; i += blockDim.x) order[i] = int32_t(keys[i] & 0xffffffffu);
}

// A warp a (list, row): its entries written (each lane's run after the lower lanes'), its marks cleared.
template <bool kKeys>
__global__ void __launch_bounds__(kWarps * 32)
    block_entries(BlockTileArgs a, int64_t rows, int sub, BlockKeyScratch s) {
  const int lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (t >= int64_t(a.lists) * rows) return;
  const MarkRow<kKeys> c(a, s, rows, t, lane);
  const int64_t mine = c.entries(a, sub, nullptr, 0);
  int64_t below = mine;  // inclusive scan over the lanes
  for (int o = 1; o < 32; o *= 2) {
    const int64_t x = __shfl_up_sync(~0u, below, o);
    if (lane >= o) below += x;
  }
  below -= mine;
  const int64_t* offsets = a.row_offsets + c.l * (rows + 1);
  const int64_t at = offsets[c.r] + below, end = offsets[c.r + 1];
  if (at < end) c.entries(a, sub, reinterpret_cast<Entry4*>(a.entries) + at, end - at);
  for (int64_t w = c.w0; w < c.w1; ++w) c.part[w] = 0, c.full[w] = 0;
}

// The four launches of either build: rows of marks (key tiles or query tiles), `sub` 64-row query tiles a block.
template <bool kKeys>
int launch_grid_lists(const BlockTileArgs& a, int q_blocks, int64_t rows, int sub, const BlockKeyScratch& s,
                      cudaStream_t st) {
  if (rows == 0 || a.lists == 0) return int(cudaSuccess);
  cudaError_t e = cudaSuccess;
  if (q_blocks > 0) {
    const unsigned ctas = unsigned((int64_t(q_blocks) * a.lists + kWarps - 1) / kWarps);
    block_marks<kKeys><<<ctas, kWarps * 32, 0, st>>>(a, q_blocks, s);
    if ((e = cudaGetLastError()) != cudaSuccess) return int(e);
  }
  const unsigned ctas = unsigned((int64_t(a.lists) * rows + kWarps - 1) / kWarps);
  block_counts<kKeys><<<ctas, kWarps * 32, 0, st>>>(a, rows, sub, s);
  if ((e = cudaGetLastError()) != cudaSuccess) return int(e);
  block_offsets<<<unsigned(a.lists), kListThreads, 0, st>>>(a, int(rows), s);
  if ((e = cudaGetLastError()) != cudaSuccess) return int(e);
  block_entries<kKeys><<<ctas, kWarps * 32, 0, st>>>(a, rows, sub, s);
  return int(cudaGetLastError());
}

// ---- top-k keys ----
// A CTA a (list, query row): its K listed keys and its band's keys set their bits (atomicOr: rows of a tile share words).
__global__ void __launch_bounds__(kMaskThreads) topk_scatter(TopkTileArgs a) {
  const int64_t l = blockIdx.y, q = blockIdx.x;
  const int64_t band_n = a.band ? int64_t(a.hi) - a.lo + 1 : 0;
  for (int64_t j = threadIdx.x; j < a.topk + band_n; j += blockDim.x) {
    const int64_t k = j < a.topk ? load_index(a.idx, a.idx_bits, l * a.idx_s[0] + q * a.idx_s[1] + j * a.idx_s[2])
                                 : q + a.lo + (j - a.topk);
    if (k < 0 || k >= a.k_len) continue;
    const int64_t qt = q / 128, kt = k / 128, bit = (q % 128) * 128 + k % 128;
    if (a.masks) {
      const int64_t t = (l * a.q_tiles + qt) * a.k_tiles + kt;
      atomicOr(a.masks + t * 256 + bit / 64, 1ull << (bit % 64));
      a.flags[t] = 1;
    }
    if (a.key_masks) {
      const int64_t u = (l * a.k_tiles + kt) * a.q_tiles64 + q / 64;
      atomicOr(a.key_masks + u * 128 + k % 128, 1ull << (q % 64));
      a.key_flags[u] = 1;
    }
  }
}

// A CTA a list: the flagged tiles of each row of `rows` tiles of `cols` flags, as bitmask entries of their own index.
__global__ void __launch_bounds__(kListThreads) flagged_lists(const unsigned char* flags, int rows, int cols,
                                                              int64_t* offsets, int* entries) {
  const int64_t l = blockIdx.x, base = l * rows * cols;
  const unsigned char* f = flags + base;
  Entry4* e = reinterpret_cast<Entry4*>(entries);
  scan_lists(
      rows, base, int64_t(rows) * cols, offsets + l * (rows + 1),
      [&](int r) {
        int64_t n = 0;
        for (int c = 0; c < cols; ++c) n += f[int64_t(r) * cols + c];
        return n;
      },
      [&](int r, int64_t at, int64_t) {
        for (int c = 0; c < cols; ++c)
          if (f[int64_t(r) * cols + c]) e[at++] = Entry4{c, int(base + int64_t(r) * cols + c), 0, 0};
      });
}

__device__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ float to_f32(__half x) { return __half2float(x); }
template <class T> __device__ T from_f32(float x);
template <> __device__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __half from_f32<__half>(float x) { return __float2half(x); }

// A thread an element of dst: the group's partials summed in fp32.
template <class T>
__global__ void group_sum(GroupSumArgs a) {
  const int64_t n = int64_t(a.batch) * a.len * a.dim, slot = n;
  const T* src = static_cast<const T*>(a.src);
  T* dst = static_cast<T*>(a.dst);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.f;
    for (int g = 0; g < a.group; ++g) s += to_f32(src[g * slot + i]);
    const int64_t d = i % a.dim, r = i / a.dim, k = r % a.len, b = r / a.len;
    dst[b * a.dst_s[0] + k * a.dst_s[1] + d * a.dst_s[2]] = from_f32<T>(s);
  }
}

}  // namespace

int launch_group_sum(const GroupSumArgs& a, void* stream) {
  const int64_t n = int64_t(a.batch) * a.len * a.dim;
  if (n == 0) return int(cudaSuccess);
  const unsigned blocks = unsigned(n / 256 + 1 < 8192 ? n / 256 + 1 : 8192);
  auto s = static_cast<cudaStream_t>(stream);
  if (a.bf16)
    group_sum<__nv_bfloat16><<<blocks, 256, 0, s>>>(a);
  else
    group_sum<__half><<<blocks, 256, 0, s>>>(a);
  return int(cudaGetLastError());
}

int launch_topk_tiles(const TopkTileArgs& a, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (a.q_len == 0 || a.lists == 0) return int(cudaSuccess);
  const size_t tiles = size_t(a.lists) * a.q_tiles * a.k_tiles, key_tiles = size_t(a.lists) * a.k_tiles * a.q_tiles64;
  cudaError_t e = cudaSuccess;
  if (a.masks) e = cudaMemsetAsync(a.masks, 0, tiles * 256 * 8, s);
  if (e == cudaSuccess && a.masks) e = cudaMemsetAsync(a.flags, 0, tiles, s);
  if (e == cudaSuccess && a.key_masks) e = cudaMemsetAsync(a.key_masks, 0, key_tiles * 128 * 8, s);
  if (e == cudaSuccess && a.key_masks) e = cudaMemsetAsync(a.key_flags, 0, key_tiles, s);
  if (e != cudaSuccess) return int(e);
  topk_scatter<<<dim3(unsigned(a.q_len), unsigned(a.lists)), kMaskThreads, 0, s>>>(a);
  if ((e = cudaGetLastError()) != cudaSuccess) return int(e);
  if (a.masks) {
    flagged_lists<<<a.lists, kListThreads, 0, s>>>(a.flags, a.q_tiles, a.k_tiles, a.row_offsets, a.entries);
    if ((e = cudaGetLastError()) != cudaSuccess) return int(e);
  }
  if (a.key_masks)
    flagged_lists<<<a.lists, kListThreads, 0, s>>>(a.key_flags, a.k_tiles, a.q_tiles64, a.key_offsets, a.key_entries);
  return int(cudaGetLastError());
}

int launch_block_key_tiles(const BlockTileArgs& a, int q_blocks, int q_block, void* stream) {
  if (a.k_tiles == 0 || a.lists == 0) return int(cudaSuccess);
  block_key_lists<<<a.lists, kListThreads, size_t(a.k_tiles) * sizeof(int), static_cast<cudaStream_t>(stream)>>>(
      a, q_blocks, q_block / 64);
  return int(cudaGetLastError());
}

int launch_block_key_tiles_grid(const BlockTileArgs& a, int q_blocks, int q_block, const BlockKeyScratch& s,
                                void* stream) {
  return launch_grid_lists<true>(a, q_blocks, a.k_tiles, q_block / 64, s, static_cast<cudaStream_t>(stream));
}

int launch_block_tiles_grid(const BlockTileArgs& a, const BlockKeyScratch& s, void* stream) {
  BlockKeyScratch f = s;
  f.order = nullptr;
  return launch_grid_lists<false>(a, a.q_tiles, a.q_tiles, 1, f, static_cast<cudaStream_t>(stream));
}

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
