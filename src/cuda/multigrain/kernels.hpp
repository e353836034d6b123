// The host handles of the Multigrain kernels: one per kernel, each with Arguments (what the caller gives),
// can_implement() (a Status with a reason, never an abort), workspace_size() and run(args, stream), which
// can be relaunched and captured in a graph. Plain C++: included by the plan (g++) and the kernels (nvcc).
#pragma once
// Kept C++17-clean (no spattn/pattern.hpp): the .cu files build with whichever dialect nvcc is given.
#include <cstdint>
#include <string>

#include "spattn/tensor.hpp"

struct CUstream_st;

namespace spattn::multigrain {

using Stream = CUstream_st*;  // cudaStream_t

// A status with a reason, never an abort.
struct Status {
  bool ok = true;
  std::string reason;
  static Status success() { return {}; }
  static Status failure(std::string why) { return {false, std::move(why)}; }
  explicit operator bool() const { return ok; }
};

}  // namespace spattn::multigrain

namespace spattn::multigrain::detail {

// A [B, L, H, D] tensor on the device: strides in elements, innermost stride 1.
struct Dense {
  const void* data = nullptr;
  int64_t sb = 0, sl = 0, sh = 0;
};

struct Shape {
  DType dtype = DType::bf16;
  int64_t B = 0, Hq = 0, Hkv = 0, Lq = 0, Lk = 0, D = 0, Dv = 0;
  int64_t bh() const { return B * Hq; }
};

// Coarse part on the device. One work item of SDDMM is a slice of a block row: {block_row, first, last}.
struct CoarseMeta {
  int block = 64;
  int64_t block_rows = 0, nblocks = 0;
  const int32_t* row_offsets = nullptr;  // [block_rows + 1]
  const int32_t* cols = nullptr;         // [nblocks]
  const int32_t* mask_index = nullptr;   // [nblocks] -1: full
  const uint64_t* masks = nullptr;       // [npartial][block*block/64]
};

// Fine part on the device.
struct FineMeta {
  int64_t nnz = 0;
  const int64_t* row_offsets = nullptr;  // [Lq + 1]
  const int32_t* cols = nullptr;         // [nnz]
};

struct FineItem {  // a slice of one row of the fine part
  int64_t begin;
  int32_t row;
  int32_t len;
};

// S_coarse = Q K^T on the coarse blocks (tensor cores; bf16/f16; block 32/64).
struct SddmmCoarse {
  struct Arguments {
    Shape shape;
    Dense q, k;
    CoarseMeta meta;
    const int32_t* items = nullptr;  // [nitems][3]
    int64_t nitems = 0;
    void* s = nullptr;  // [bh][nblocks][block][block], input dtype
  };
  static Status can_implement(const Arguments& a);
  static int64_t workspace_size(const Arguments&) { return 0; }
  static void run(const Arguments& a, Stream stream);
};

// S_fine = Q K^T on the fine CSR entries (CUDA cores; warp per row slice).
struct SddmmFine {
  struct Arguments {
    Shape shape;
    Dense q, k;
    FineMeta meta;
    const FineItem* items = nullptr;
    int64_t nitems = 0;
    void* s = nullptr;  // [bh][nnz], input dtype
  };
  static Status can_implement(const Arguments& a);
  static int64_t workspace_size(const Arguments&) { return 0; }
  static void run(const Arguments& a, Stream stream);
};

// P = softmax(scale * S) over a row made of coarse block rows and fine entries; LSE; masking fused.
struct CompoundSoftmax {
  struct Arguments {
    Shape shape;  // dtype: that of P
    float scale = 1;
    CoarseMeta coarse;  // nblocks == 0: no coarse part
    FineMeta fine;      // nnz == 0: no fine part
    const void* s_coarse = nullptr;  // S in the dtype of P
    const void* s_fine = nullptr;
    void* p_coarse = nullptr;
    void* p_fine = nullptr;
    float* lse = nullptr;  // [B, Hq, Lq] or null
  };
  static Status can_implement(const Arguments& a);
  static int64_t workspace_size(const Arguments&) { return 0; }
  static void run(const Arguments& a, Stream stream);
};

// O = P_coarse V (tensor cores). Rows with a fine part too (fine_row_index >= 0) go to the fp32 partial
// buffer `partial[bh][fine_row_index][Dv]`; the others straight to O.
struct SpmmCoarse {
  struct Arguments {
    Shape shape;
    const void* p = nullptr;  // [bh][nblocks][block][block]
    Dense v;
    Dense o;  // data is written
    CoarseMeta meta;
    const int32_t* row_order = nullptr;       // [block_rows] heaviest first
    const int32_t* fine_row_index = nullptr;  // [Lq] or null (no fine part)
    int64_t fine_rows = 0;
    float* partial = nullptr;
  };
  static Status can_implement(const Arguments& a);
  static int64_t workspace_size(const Arguments&) { return 0; }
  static void run(const Arguments& a, Stream stream);
};

// O_fine = P_fine V (CUDA cores; warp per row). With `partial` null the rows in `rows` are written to O
// (then `rows` lists every query row); otherwise the fp32 rows go to partial[bh][i][Dv] for rows[i].
struct SpmmFine {
  struct Arguments {
    Shape shape;
    const void* p = nullptr;  // [bh][nnz]
    Dense v;
    Dense o;
    FineMeta meta;
    const int32_t* rows = nullptr;
    int64_t nrows = 0;
    float* partial = nullptr;
  };
  static Status can_implement(const Arguments& a);
  static int64_t workspace_size(const Arguments&) { return 0; }
  static void run(const Arguments& a, Stream stream);
};

// O[rows[i]] = partial_coarse[i] + partial_fine[i] for the rows that have both parts.
struct MergeRows {
  struct Arguments {
    Shape shape;
    Dense o;
    const int32_t* rows = nullptr;
    int64_t nrows = 0;
    const float* a = nullptr;
    const float* b = nullptr;
  };
  static Status can_implement(const Arguments& a);
  static int64_t workspace_size(const Arguments&) { return 0; }
  static void run(const Arguments& a, Stream stream);
};

}  // namespace spattn::multigrain::detail
