// cuda/fused/random_rows.cu — random rows drawn on the device (random_rows.hpp).
#include <cuda_runtime.h>

#include "cuda/fused/random_rows.hpp"
#include "pattern/random_hash.hpp"
#include "plan/kernels.hpp"

namespace spattn::cuda::fused {
namespace {

// One warp a CTA; lane i < rows draws row q0 + i into its bitmap of `words` words in shared memory (rows past q_len:
// zero). Then kTiles: the CTA's rows (all in one query tile: rows divides block_m) are stored into every key tile's
// bitmask, a key tile's rows x block_n / 64 words at a time (contiguous); kCount: each lane counts its row's keys
// outside the band; kFill: writes them.
enum Mode { kTiles, kCount, kFill };

struct Args {
  int64_t r, q_len, k_len;
  uint64_t seed;
  int64_t band_lo, band_hi;         // kCount, kFill: keys with band_lo <= k - q <= band_hi dropped (lo > hi: none)
  int32_t* counts;                  // kCount
  bool offsets_given;               // kFill: row q's keys at cols + offsets[q]; else offsets[q] = q r written too
  int64_t cols_len;                 // kFill: keys cols holds (a row past it is not written)
  int rows, words;                  // rows a CTA; words a row's bitmap (the key tiles' words for kTiles)
  int block_m, block_n, k_tiles;    // kTiles
  unsigned long long* masks;        // kTiles
  int64_t* offsets;                 // CSR
  int32_t* cols;
};

template <Mode kMode>
__global__ void __launch_bounds__(32) random_rows_kernel(Args a) {
  extern __shared__ unsigned long long bits[];
  const int lane = int(threadIdx.x);
  const int64_t q0 = int64_t(blockIdx.x) * a.rows, q = q0 + lane;
  for (int i = lane; i < a.rows * a.words; i += 32) bits[i] = 0;
  __syncwarp();
  const bool live = lane < a.rows && q < a.q_len;
  if (live) {
    unsigned long long* b = bits + lane * a.words;
    const uint64_t key = detail::random_row_key(a.seed, uint64_t(q));
    // Floyd (PATTERNS.md): for j = Lk - r ... Lk - 1, t = h mod (j + 1); t in the set ? add j : add t.
#pragma unroll 4
    for (uint64_t j = uint64_t(a.k_len - a.r); j < uint64_t(a.k_len); ++j) {
      const uint32_t t = detail::random_draw(key, j);
      const unsigned long long w = b[t >> 6];
      if ((w >> (t & 63)) & 1)
        b[j >> 6] |= 1ull << (j & 63);
      else
        b[t >> 6] = w | 1ull << (t & 63);
    }
  }
  __syncwarp();
  if constexpr (kMode == kTiles) {
    const int rw = a.block_n / 64, per_kt = a.rows * rw, tile_words = a.block_m * rw;
    const int64_t qt = q0 / a.block_m;
    unsigned long long* out = a.masks + qt * a.k_tiles * int64_t(tile_words) + (q0 - qt * a.block_m) * rw;
    for (int i = lane, n = a.k_tiles * per_kt; i < n; i += 32) {
      const int kt = i / per_kt, rem = i - kt * per_kt, row = rem / rw;
      out[int64_t(kt) * tile_words + rem] = bits[row * a.words + kt * rw + (rem - row * rw)];
    }
  } else if (live) {
    const unsigned long long* b = bits + lane * a.words;
    const int64_t lo = q + a.band_lo, hi = q + a.band_hi;  // the band's keys of row q
    int32_t* out = kMode == kFill ? a.cols + (a.offsets_given ? a.offsets[q] : q * a.r) : nullptr;
    if (kMode == kFill && a.offsets_given && (a.offsets[q] < 0 || a.offsets[q + 1] > a.cols_len)) out = nullptr;
    int32_t n = 0;
    for (int w = 0; w < a.words; ++w)
      for (unsigned long long x = b[w]; x; x &= x - 1) {
        const int64_t k = int64_t(w) * 64 + __ffsll(static_cast<long long>(x)) - 1;
        if (k >= lo && k <= hi) continue;
        if constexpr (kMode == kFill)
          if (out) out[n] = int32_t(k);
        ++n;
      }
    if constexpr (kMode == kCount) a.counts[q] = n;
    if (kMode == kFill && !a.offsets_given) {
      a.offsets[q + 1] = (q + 1) * a.r;
      if (q == 0) a.offsets[0] = 0;
    }
  }
}

// Rows a CTA: the most (a power of two up to 32) whose bitmaps fit 64 KiB, at least one.
int rows_per_cta(int words) {
  int rows = 32;
  while (rows > 1 && int64_t(rows) * words * 8 > 64 * 1024) rows /= 2;
  return rows;
}

template <Mode kMode>
int launch(Args a, int64_t ctas, void* stream) {
  const size_t smem = size_t(a.rows) * size_t(a.words) * 8;
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(random_rows_kernel<kMode>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return int(e);
  }
  random_rows_kernel<kMode><<<unsigned(ctas), 32, smem, static_cast<cudaStream_t>(stream)>>>(a);
  return int(cudaGetLastError());
}

}  // namespace

int launch_random_tile_masks(int64_t r, uint64_t seed, int64_t q_len, int64_t k_len, int block_m, int block_n,
                             unsigned long long* masks, void* stream) {
  if (!plan::device_draws_random(r, q_len, k_len) || (block_m != 64 && block_m != 128 && block_m != 192) || (block_n != 64 && block_n != 128) ||
      !masks)
    return int(cudaErrorInvalidValue);
  if (q_len == 0) return 0;
  Args a{};
  a.r = r, a.q_len = q_len, a.k_len = k_len, a.seed = seed;
  a.block_m = block_m, a.block_n = block_n;
  a.k_tiles = int((k_len + block_n - 1) / block_n);
  a.words = a.k_tiles * (block_n / 64);
  a.rows = rows_per_cta(a.words);  // a power of two up to 32: divides block_m
  a.masks = masks;
  const int64_t q_tiles = (q_len + block_m - 1) / block_m;
  return launch<kTiles>(a, q_tiles * block_m / a.rows, stream);
}

namespace {
Args csr_args(int64_t r, uint64_t seed, int64_t q_len, int64_t k_len, int64_t band_lo, int64_t band_hi) {
  Args a{};
  a.r = r, a.q_len = q_len, a.k_len = k_len, a.seed = seed;
  a.band_lo = band_lo, a.band_hi = band_hi;
  a.words = int((k_len + 63) / 64);
  a.rows = rows_per_cta(a.words);
  return a;
}
}  // namespace

int launch_random_counts(int64_t r, uint64_t seed, int64_t q_len, int64_t k_len, int64_t band_lo, int64_t band_hi,
                         int32_t* counts, void* stream) {
  if (!plan::device_draws_random(r, q_len, k_len) || (q_len > 0 && !counts)) return int(cudaErrorInvalidValue);
  if (q_len == 0) return 0;
  Args a = csr_args(r, seed, q_len, k_len, band_lo, band_hi);
  a.counts = counts;
  return launch<kCount>(a, (q_len + a.rows - 1) / a.rows, stream);
}

namespace {
// One CTA of 1024 threads: the rows in blocks of 1024 x 16, a thread's 16 summed, the sums scanned in shared memory
// (Hillis-Steele), then each thread's offsets written from its prefix; the carry from block to block.
__global__ void __launch_bounds__(1024) offsets_kernel(const int32_t* counts, int64_t n, int64_t* offsets) {
  __shared__ int64_t sums[1024];
  constexpr int kPer = 16;
  const int t = int(threadIdx.x);
  int64_t carry = 0;
  if (t == 0) offsets[0] = 0;
  for (int64_t b0 = 0; b0 < n; b0 += 1024 * kPer) {
    const int64_t i0 = b0 + int64_t(t) * kPer;
    int64_t s = 0;
    for (int j = 0; j < kPer; ++j) s += i0 + j < n ? counts[i0 + j] : 0;
    sums[t] = s;
    __syncthreads();
    for (int d = 1; d < 1024; d *= 2) {
      const int64_t v = t >= d ? sums[t - d] : 0;
      __syncthreads();
      sums[t] += v;
      __syncthreads();
    }
    int64_t run = carry + sums[t] - s;  // the rows before this thread's
    for (int j = 0; j < kPer && i0 + j < n; ++j) offsets[i0 + j + 1] = run += counts[i0 + j];
    carry += sums[1023];
    __syncthreads();
  }
}
}  // namespace

int launch_random_offsets(const int32_t* counts, int64_t q_len, int64_t* offsets, void* stream) {
  if (q_len < 0 || !offsets || (q_len > 0 && !counts)) return int(cudaErrorInvalidValue);
  offsets_kernel<<<1, 1024, 0, static_cast<cudaStream_t>(stream)>>>(counts, q_len, offsets);
  return int(cudaGetLastError());
}

int launch_random_csr(int64_t r, uint64_t seed, int64_t q_len, int64_t k_len, int64_t band_lo, int64_t band_hi,
                      bool offsets_given, int64_t* offsets, int32_t* cols, int64_t cols_len, void* stream) {
  if (!plan::device_draws_random(r, q_len, k_len) || !offsets || (q_len > 0 && !cols) || (!offsets_given && band_lo <= band_hi))
    return int(cudaErrorInvalidValue);
  if (q_len == 0)
    return offsets_given ? 0 : int(cudaMemsetAsync(offsets, 0, sizeof(int64_t), static_cast<cudaStream_t>(stream)));
  Args a = csr_args(r, seed, q_len, k_len, band_lo, band_hi);
  if (!offsets_given && cols_len < q_len * r) return int(cudaErrorInvalidValue);
  a.offsets = offsets, a.cols = cols, a.offsets_given = offsets_given, a.cols_len = cols_len;
  return launch<kFill>(a, (q_len + a.rows - 1) / a.rows, stream);
}

}  // namespace spattn::cuda::fused
