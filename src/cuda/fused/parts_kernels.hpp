// cuda/fused/parts_kernels.hpp — the kernels of compound plans (plan/parts.hpp) beside the tile kernels: the
// fine-grained kernel of scattered parts, the key gather of columns parts and the merge of two partial results.
// Plain data, no CUDA header; defined in parts_kernels.cu.
#pragma once
#include <cstdint>

namespace spattn::cuda::fused {

// Strides in elements; the head dim contiguous, every row 16-byte aligned (checked by the caller).
struct RowTensor {
  void* data = nullptr;
  int64_t sb = 0, sl = 0, sh = 0;
};

// Scattered part: row q of every (batch, head) keeps keys cols[offsets[q] .. offsets[q + 1]). One warp a
// (b, q, h): eight lanes a key (each lane D/8 elements, a 16-byte load per 8), four keys at a time, online
// softmax in fp32 on CUDA cores, K/V rows gathered through L2. merge 0: writes O and lse (an empty row: 0 and
// -inf); merge 1: merges its result into the O and lse already there (plan/merge.hpp; an empty row leaves them).
struct ScatteredParams {
  RowTensor q, k, v, o;
  float* lse = nullptr;  // [B, Hq, Lq] at lse_sb, lse_sh (row stride 1); required
  int64_t lse_sb = 0, lse_sh = 0;
  const int64_t* offsets = nullptr;
  const int32_t* cols = nullptr;
  int batch = 0, q_heads = 0, group = 1, q_len = 0, head_dim = 64;
  float scale_log2 = 0;
  int merge = 0;
  bool bf16 = true;
};
int launch_scattered(const ScatteredParams& p, void* stream);

// Columns part: dst[b, j, h, :] = src[b, keys[j], h, :] for j < nkeys, h < heads (dst contiguous).
int launch_gather_keys(const RowTensor& src, void* dst, const int32_t* keys, int batch, int nkeys, int heads,
                       int head_dim, void* stream);

// (o, lse) <- merge((o, lse), (o2, lse2)) on every row (plan/merge.hpp); o2 contiguous [B, Lq, Hq, D], lse2 [B, Hq, Lq].
int launch_merge(const RowTensor& o, float* lse, int64_t lse_sb, int64_t lse_sh, const void* o2, const float* lse2,
                 int batch, int q_len, int q_heads, int head_dim, bool bf16, void* stream);

}  // namespace spattn::cuda::fused
