// cuda/fused/strip_masks.cu — a strip plan's bitmasks computed on the device (strip_masks.hpp).
#include <cuda_runtime.h>

#include "cuda/fused/strip_masks.hpp"
#include "plan/key_strips.hpp"

namespace spattn::cuda::fused {
namespace {

struct Grid {
  int dims[3];     // right-aligned axes
  int offset[3];   // axis a's first triple in windows
};

// One CTA an entry (1668 for na2d at L = 16384; one a query tile left 2 CTAs an SM, latency bound), thread r its row
// r: the CTA's query tile by bisection of the row offsets, each slot's key coordinates computed once into shared memory
// by the thread of the same index, then the row's word over the slots.
__global__ void __launch_bounds__(64) grid_strip_masks_kernel(int64_t q_tiles, const int64_t* row_offsets,
                                                              const int4* entries, const int32_t* q_map,
                                                              const int32_t* windows, Grid g, int sx, int sy,
                                                              unsigned long long* masks) {
  __shared__ int key[3][64];
  const int64_t i = blockIdx.x;
  const int r = int(threadIdx.x);
  int64_t lo = 0, hi = q_tiles - 1;  // the query tile qt with row_offsets[qt] <= i < row_offsets[qt + 1]
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (row_offsets[mid] <= i) lo = mid;
    else hi = mid - 1;
  }
  const int4 e = entries[i];
  const int n = (e.w >> 7) & 127;  // slots that hold tokens (strip_pack)
  if (r < n) {
    const int k = plan::strip_token(e.z, e.w, r, sx, sy);
    key[2][r] = k % g.dims[2];
    key[1][r] = (k / g.dims[2]) % g.dims[1];
    key[0][r] = k / (g.dims[2] * g.dims[1]);
  }
  __syncthreads();
  const int q = q_map[lo * 64 + r];
  unsigned long long word = 0;
  if (q >= 0) {
    const int c[3] = {q / (g.dims[2] * g.dims[1]), (q / g.dims[2]) % g.dims[1], q % g.dims[2]};
    int start[3], stride[3], count[3];
    for (int a = 0; a < 3; ++a) {
      const int32_t* w = windows + 3 * (g.offset[a] + c[a]);
      start[a] = w[0], stride[a] = w[1], count[a] = w[2];
    }
    for (int s = 0; s < n; ++s) {
      bool in = true;
#pragma unroll
      for (int a = 0; a < 3; ++a) {
        const int d = key[a][s] - start[a];
        in = in && d >= 0 && (stride[a] == 1 ? d < count[a] : d % stride[a] == 0 && d / stride[a] < count[a]);
      }
      word |= (unsigned long long)(in) << s;
    }
  }
  masks[int64_t(e.y) * 64 + r] = word;
}

}  // namespace

int launch_grid_strip_masks(int64_t q_tiles, int64_t n, const int64_t* row_offsets, const int32_t* entries,
                            const int32_t* q_map, const int32_t* windows, const int64_t* dims, int sx, int sy, unsigned long long* masks,
                            void* stream) {
  if (q_tiles < 0 || n < 0 || n >= (int64_t(1) << 31) || (q_tiles == 0 && n > 0) ||
      (n > 0 && (!row_offsets || !entries || !q_map || !windows || !masks)))
    return int(cudaErrorInvalidValue);
  Grid g{};
  for (int a = 0, off = 0; a < 3; ++a) {
    if (dims[a] < 1 || dims[a] >= (int64_t(1) << 31)) return int(cudaErrorInvalidValue);
    g.dims[a] = int(dims[a]);
    g.offset[a] = off;
    off += int(dims[a]);
  }
  if (n == 0) return 0;
  grid_strip_masks_kernel<<<unsigned(n), 64, 0, static_cast<cudaStream_t>(stream)>>>(
      q_tiles, row_offsets, reinterpret_cast<const int4*>(entries), q_map, windows, g, sx, sy, masks);
  return int(cudaGetLastError());
}

}  // namespace spattn::cuda::fused
