// The host handles of the Multigrain kernels: one per kernel, each with Arguments (what the caller gives),
// can_implement() (a Status with a reason, never an abort), workspace_size() and run(args, stream), which
// can be relaunched and captured in a graph. Plain C++: included by the plan (g++) and the kernels (nvcc).
#pragma once
// Kept C++17-clean (no spattn/pattern.hpp): the .cu files build with whichever dialect nvcc is given.
#include <driver_types.h>  // cudaStream_t

#include <cstdint>
#include <string>

#include "common/status.hpp"
#include "spattn/tensor.hpp"

namespace spattn::unfused {

using common::Status;  // common/status.hpp

}  // namespace spattn::unfused

namespace spattn::unfused::detail {

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

// The fine part regrouped for the tensor-core path: 64-row tiles x 64-key chunks ("pairs"), only the
// occupied ones; entries sorted by (tile, chunk, row, key), each with its CSR index and place in the tile.
constexpr int kFineTileRows = 64, kFineChunkKeys = 64;
struct FineTiles {
  int64_t ntiles = 0, npairs = 0;
  const int32_t* tile_pairs = nullptr;  // [ntiles + 1] pair range of each tile
  const int32_t* pair_chunk = nullptr;  // [npairs] key chunk of each pair
  const int32_t* groups = nullptr;      // [npairs * 4 + 1] entry range of (pair, warp): rows 16w..16w+15
  const int32_t* pos = nullptr;         // [nnz] CSR index of each entry
  const uint16_t* rc = nullptr;         // [nnz] row in tile * 64 + key in chunk
  const uint16_t* pos16 = nullptr;      // [nnz] pos minus the CSR index of the tile's first row, or null
                                        // (only where every tile holds <= 65536 entries)
  // The SDDMM and SpMM kernels take 128-row super-tiles (tiles 2T and 2T + 1: every K/V chunk read from L2
  // once for 128 rows) over the union of the two tiles' chunks ("super-pairs"); 8 warps, 4 a tile.
  int64_t nsuper = 0, nspairs = 0;
  const int32_t* super_pairs = nullptr;  // [nsuper + 1] super-pair range of each super-tile
  const int32_t* sp_chunk = nullptr;     // [nspairs] key chunk of each super-pair
  const int32_t* sp_bounds = nullptr;    // [nspairs][8][2] entry range of (super-pair, warp w): the group of
                                         // rows 16 (w % 4).. of tile 2T + w / 4 in that chunk (empty: 0, 0)
};
constexpr int kSuperRows = 2 * kFineTileRows;

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
  static void run(const Arguments& a, cudaStream_t stream);
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
  static void run(const Arguments& a, cudaStream_t stream);
};

// S_fine = Q K^T on the fine entries through tensor cores: per occupied (super-tile, chunk) pair the
// 128 x 64 scores are computed (mma.sync) and only the kept ones stored. items: {super-tile, first
// super-pair, last super-pair}.
struct SddmmFineTc {
  struct Arguments {
    Shape shape;
    Dense q, k;
    FineTiles tiles;
    int64_t nnz = 0;  // elements from one head's S to the next (the entries per head, or more with tile_order)
    const int32_t* items = nullptr;
    int64_t nitems = 0;
    void* s = nullptr;  // [bh][nnz], input dtype
    // false: S at the CSR places (tiles.pos); true: in the tiles' entry order (entry j at s[bh][j]), the
    // order TileSoftmax and SpmmFineTc with tile_order read (coalesced stores, no pos).
    bool tile_order = false;
  };
  static Status can_implement(const Arguments& a);
  static void run(const Arguments& a, cudaStream_t stream);
};

// O = P_fine V through tensor cores (a plan with no coarse part): per (128-row super-tile, chunk) pair the
// kept P are scattered into a zeroed 128 x 64 tile in shared memory and multiplied by the V chunk. Every
// query row of O is written.
struct SpmmFineTc {
  struct Arguments {
    Shape shape;
    const void* p = nullptr;  // [bh][nnz]
    Dense v;
    Dense o;
    FineTiles tiles;
    int64_t nnz = 0;  // elements from one head's P to the next (as SddmmFineTc)
    // Optional: p holds S, and P = exp2(S * sl2 - lse2[bh][row]) is formed as it is gathered.
    const float* lse2 = nullptr;
    float sl2 = 0;
    bool tile_order = false;  // p in the tiles' entry order (see SddmmFineTc), else at the CSR places
    bool pdl = false;         // launched as a programmatic dependent of the kernel before it (sm_90+): the
                              // prologue (V chunks, entry places) overlaps that kernel's tail
  };
  static Status can_implement(const Arguments& a);
  static void run(const Arguments& a, cudaStream_t stream);
};

// The softmax of a fine-only tensor-core plan over S in the tiles' entry order: one CTA per (64-row tile,
// b*h) gathers the tile's S (one contiguous range in both orders) into CSR order in shared memory, reduces
// each row there, writes P at the CSR places (when p_csr is given, coalesced) and the LSE, and writes P back
// over S in the tiles' order for SpmmFineTc (tile_order). bf16/f16; a tile holds <= max_tile_entries.
struct TileSoftmax {
  struct Arguments {
    Shape shape;
    float scale = 1;
    FineMeta fine;
    FineTiles tiles;
    int64_t max_tile_entries = 0;
    void* s = nullptr;       // [bh][s_stride] S in tile order, overwritten by P in tile order; 16-byte aligned
    int64_t s_stride = 0;    // elements from one head's S to the next: >= nnz, a multiple of 8
    void* p_csr = nullptr;   // [bh][nnz] P at the CSR places, or null
    float* lse = nullptr;    // [B, Hq, Lq] natural log, or null
    bool pdl = false;        // launched as a programmatic dependent (sm_90+): see SpmmFineTc
  };
  static constexpr int64_t kMaxTileEntries = 96 * 1024;  // 192 KB of shared memory at 2 bytes
  static Status can_implement(const Arguments& a);
  static void run(const Arguments& a, cudaStream_t stream);
};

// Attention without P on a fine-only plan, fused (flash-style over the occupied tiles): one CTA of 8 warps
// per (128-row query tile, b*h) walks the tile's occupied 64-key chunks; per chunk S = Q K^T on tensor
// cores, entries outside the pattern masked (a 128 x 64 bitmask per pair), online softmax in registers,
// O += P V on tensor cores. Neither S nor P is written. D == Dv, 64 or 128, bf16/f16.
constexpr int kAttTileRows = 128;
struct AttTiles {
  int64_t ntiles = 0, npairs = 0;
  const int32_t* tile_pairs = nullptr;  // [ntiles + 1]
  const int32_t* pair_chunk = nullptr;  // [npairs]
  const uint64_t* masks = nullptr;      // [npairs][128]: bit c of word r: (row r of the tile, key c of the chunk)
};
struct AttentionFineTc {
  struct Arguments {
    Shape shape;
    Dense q, k, v, o;
    AttTiles tiles;
    float scale = 1;
    float* lse = nullptr;  // [B, Hq, Lq] natural log, or null
  };
  static Status can_implement(const Arguments& a);
  static void run(const Arguments& a, cudaStream_t stream);
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
    // Optional: the row LSE in the log2 domain of scale * log2(e) * S, +inf for an empty row ([B*Hq][Lq]).
    // With it, P may be null (both parts): then only the LSE is computed (SpMM forms P itself).
    float* lse2 = nullptr;
    // Coarse blocks of a typical block row (the plan gives the 90th percentile of the nonempty ones): how
    // many the block-row kernel holds in registers (block 32: 16 or 24).
    int row_blocks_hint = 0;
  };
  static Status can_implement(const Arguments& a);
  static int64_t workspace_size(const Arguments&) { return 0; }
  static void run(const Arguments& a, cudaStream_t stream);
};

// O = P_coarse V (tensor cores). With a fine part (fine.nnz > 0) the CTA adds the fine entries of its
// rows (CUDA cores, V rows from L2) to its fp32 tile before writing O: no partial buffers, no merge.
struct SpmmCoarse {
  struct Arguments {
    Shape shape;
    const void* p = nullptr;  // [bh][nblocks][block][block]
    Dense v;
    Dense o;  // data is written
    CoarseMeta meta;
    const int32_t* row_order = nullptr;  // [block_rows] heaviest first
    FineMeta fine;                       // nnz == 0: no fine part
    const void* p_fine = nullptr;        // [bh][fine nnz]
  };
  static Status can_implement(const Arguments& a);
  static int64_t workspace_size(const Arguments&) { return 0; }
  static void run(const Arguments& a, cudaStream_t stream);
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
  static void run(const Arguments& a, cudaStream_t stream);
};

}  // namespace spattn::unfused::detail
