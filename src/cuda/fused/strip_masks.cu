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

// One CTA a query tile, thread r its row r: the row's three windows, then one word a strip entry.
__global__ void __launch_bounds__(64) grid_strip_masks_kernel(const int64_t* row_offsets, const int4* entries,
                                                              const int32_t* q_map, const int32_t* windows, Grid g,
                                                              int sx, int sy, unsigned long long* masks) {
  const int64_t qt = blockIdx.x;
  const int r = int(threadIdx.x);
  const int q = q_map[qt * 64 + r];
  int start[3] = {0, 0, 0}, stride[3] = {1, 1, 1}, count[3] = {0, 0, 0};
  if (q >= 0) {
    int c[3];
    c[2] = q % g.dims[2];
    c[1] = (q / g.dims[2]) % g.dims[1];
    c[0] = q / (g.dims[2] * g.dims[1]);
    for (int a = 0; a < 3; ++a) {
      const int32_t* w = windows + 3 * (g.offset[a] + c[a]);
      start[a] = w[0], stride[a] = w[1], count[a] = w[2];
    }
  }
  for (int64_t i = row_offsets[qt], end = row_offsets[qt + 1]; i < end; ++i) {
    const int4 e = entries[i];
    unsigned long long word = 0;
    if (q >= 0) {
      const int n = (e.w >> 7) & 127;  // slots that hold tokens (strip_pack)
      for (int s = 0; s < n; ++s) {
        const int k = plan::strip_token(e.z, e.w, s, sx, sy);
        int c[3];
        c[2] = k % g.dims[2];
        c[1] = (k / g.dims[2]) % g.dims[1];
        c[0] = k / (g.dims[2] * g.dims[1]);
        bool in = true;
#pragma unroll
        for (int a = 0; a < 3; ++a) {
          const int d = c[a] - start[a];
          in = in && d >= 0 && d % stride[a] == 0 && d / stride[a] < count[a];
        }
        word |= (unsigned long long)(in) << s;
      }
    }
    masks[int64_t(e.y) * 64 + r] = word;
  }
}

}  // namespace

int launch_grid_strip_masks(int64_t q_tiles, const int64_t* row_offsets, const int32_t* entries, const int32_t* q_map,
                            const int32_t* windows, const int64_t* dims, int sx, int sy, unsigned long long* masks,
                            void* stream) {
  if (q_tiles < 0 || q_tiles >= (int64_t(1) << 31) || (q_tiles > 0 && (!row_offsets || !entries || !q_map || !windows || !masks)))
    return int(cudaErrorInvalidValue);
  Grid g{};
  for (int a = 0, off = 0; a < 3; ++a) {
    if (dims[a] < 1 || dims[a] >= (int64_t(1) << 31)) return int(cudaErrorInvalidValue);
    g.dims[a] = int(dims[a]);
    g.offset[a] = off;
    off += int(dims[a]);
  }
  if (q_tiles == 0) return 0;
  grid_strip_masks_kernel<<<unsigned(q_tiles), 64, 0, static_cast<cudaStream_t>(stream)>>>(
      row_offsets, reinterpret_cast<const int4*>(entries), q_map, windows, g, sx, sy, masks);
  return int(cudaGetLastError());
}

}  // namespace spattn::cuda::fused
