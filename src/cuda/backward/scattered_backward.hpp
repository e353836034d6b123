// cuda/backward/scattered_backward.hpp — the backward of a compound plan's CSR parts (issue 39: scattered keys, and
// any part the tile backward cannot run) at the forward's grain (fused/parts_kernels.cu's scattered kernel): eight
// lanes a row, four rows a warp, 16-byte loads, two entries a step software-pipelined, fp32 on CUDA cores.
//
//   dQ pass   a row (b, h, q) of the part (queries fastest: the warps in flight read one head's K/V, which stays in
//             L2): delta = rowsum(dO * O) (written for the second pass), then over the row's keys, K and V rows
//             gathered: P = exp(scale q.k - lse), dS = P (dO.v - delta), dQ = scale sum dS k;
//   dK/dV pass  a key (b, kv head, j) over the transposed CSR (built once on the host, CsrBackward): for each query
//             head of its group and query i keeping the key, Q and dO rows gathered: dK = scale sum dS q,
//             dV = sum P dO. No atomics, deterministic.
// Walks only kept pairs (a NaN reaches only the rows and keys that keep it). accumulate 1 adds to dq, dk, dv (an
// earlier part wrote them; a row or key with no entry is left as it is), 0 writes them (0 where none).
//
// Bytes, local(256) | random(8) at B = 2, H = 16, L = 16384, D = 64 (7.75 scattered keys a row, 4.06 M kept scores):
// the dQ pass gathers 256 bytes of K/V a score (1.04 GB through L2) and streams Q, dO, O, lse, dq in and dq out
// (0.33 GB); the dK/dV pass gathers Q/dO rows plus lse/delta sectors (~320 bytes a score, 1.3 GB through L2) and
// streams K, V, dk, dv (0.38 GB). At ~8 TB/s gathered through L2 (the forward's scattered kernel: 8.2 TB/s) and
// ~3.5 TB/s of HBM, about 0.3 ms the two passes, against the forward's whole 0.41 ms; the warp-per-row CSR pass it
// replaces (cuda_csr_bwd: 2-byte loads, one key a warp at a time, 8 floats a lane at any head dim) took ~4.9 ms.
// Plain data, no CUDA header; defined in scattered_backward.cu.
#pragma once
#include <cstdint>

namespace spattn::cuda {

struct ScatteredBwdParams {
  // [B, L, H, D] rows, strides in elements; the head dim contiguous, pointers and strides 16-byte aligned
  // (scattered_backward_takes).
  struct Rows {
    const void* data = nullptr;
    int64_t sb = 0, sl = 0, sh = 0;
  };
  Rows q, k, v, o, dout, dq, dk, dv;  // dq, dk, dv written (data cast from const)
  const float* lse = nullptr;         // [B, Hq, Lq] at lse_sb, lse_sh (queries contiguous), natural log
  int64_t lse_sb = 0, lse_sh = 0;
  float* delta = nullptr;  // scratch [B, Hq, Lq] at delta_sb, delta_sh
  int64_t delta_sb = 0, delta_sh = 0;
  const int64_t* row_off = nullptr;  // [Lq + 1]: row q keeps cols[row_off[q] .. row_off[q + 1])
  const int32_t* cols = nullptr;
  const int64_t* col_off = nullptr;  // [Lk + 1]: key j is kept by rows[col_off[j] .. col_off[j + 1])
  const int32_t* rows = nullptr;
  // [Lk] or null (keys in order): the dK/dV pass's keys in this order, the longest columns first (a warp's four keys
  // then keep about as many queries each: with random keys' Poisson counts, unsorted, a warp runs ~1.4x its mean).
  const int32_t* key_order = nullptr;
  int batch = 0, q_heads = 0, group = 1, q_len = 0, k_len = 0, head_dim = 64;
  float scale = 0;
  int accumulate = 0;
  bool bf16 = true;
};

// Whether the passes take these rows: bf16 or fp16, head dim 64 or 128 (v's equal), every pointer and stride
// 16-byte aligned.
bool scattered_backward_takes(const ScatteredBwdParams& p);
// Both passes enqueued on `stream` (a cudaError_t's value; requires scattered_backward_takes).
int launch_scattered_backward(const ScatteredBwdParams& p, void* stream);

}  // namespace spattn::cuda
