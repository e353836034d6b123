// cuda/backward/tile_backward.hpp — host side of the tensor-core backward (tile_bwd.cuh): the key-major plan of a
// pattern uploaded once, its scratch, the checks and the three launches (prep, dK/dV/dQ tiles, dQ finish).
#pragma once
#include <cstdint>
#include <string>

#include "cuda/common/buffer.hpp"
#include "plan/analysis.hpp"
#include "plan/gpu/block_plan.hpp"
#include "plan/gpu/launch.hpp"  // ListShape
#include "spattn/pattern.hpp"
#include "spattn/tensor.hpp"

namespace spattn::cuda {

class TileBackward {
 public:
  // Builds the tile plan of `pattern` for kernel-table row `row` (an sm90_bwd or sm90_bwd_ws row of the problem's
  // head dim: 64 queries x its block_n keys; residue permutation chosen as for the forward), transposes it
  // key-major and uploads it, with the scratch for `problem` (an fp32 dQ accumulator of B Hq Lq' D floats, Lq' the query length
  // rounded up to whole tiles per residue group; lse and delta rows).
  // query_strips: the key-major plan over query strips instead (plan/key_plan.hpp, key_major_strips; issue 39's
  // neighborhood backward), on `row` (a 64x64 sm90_bwd row); an Error saying why where the strips do not fit.
  TileBackward(const BoundPattern& pattern, const plan::Analysis& analysis, const Problem& problem, int row,
               bool query_strips = false);

  // Why the tile kernel cannot run these tensors on the current device ("" where it can): an sm_90a device,
  // bf16 / fp16 everywhere, head dim 64 or 128 (dv equal), head dims contiguous, q / k / v / dout rows 16-byte
  // aligned, dq / dk / dv 4-byte aligned, lse fp32 contiguous along the queries, lengths below 2^30.
  static std::string refusal(const Problem& p, const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& o, const TensorView& lse, const TensorView& dout, const TensorView& dq,
                             const TensorView& dk, const TensorView& dv);

  // Requires refusal(...) == "". Enqueues on `stream`; runs of one TileBackward share its scratch: one stream at
  // a time (as for the forward's work counters). dq_accumulate: dQ added to what dq holds (a later part of a compound
  // plan), else written; dkv_accumulate: dK, dV added to what dk, dv hold (a later tile part: the affine part), else
  // written.
  void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o, const TensorView& lse,
           const TensorView& dout, const TensorView& dq, const TensorView& dk, const TensorView& dv, void* stream,
           bool dq_accumulate = false, bool dkv_accumulate = false) const;

  // A key-major plan already on the device (its arrays and the scratch run() uses): plans written on the device at
  // every call (cuda/runtime/, run-time masks). q_tiles counts 64-row query tiles; perm_d 1: no permutation.
  struct DeviceLists {
    const int64_t* col_offsets = nullptr;  // [k_tiles + 1]
    const void* entries = nullptr;         // int4 {query tile, mask, lo, hi}
    const unsigned long long* masks = nullptr;
    const int32_t* order = nullptr;        // [k_tiles]
    int64_t q_tiles = 0, k_tiles = 0;
    int perm_d = 1;
    int64_t q_group = 0, k_group = 0;
    float *dq_acc = nullptr, *lse2 = nullptr, *delta = nullptr;  // B Hq q_tiles 64 (x D for dq_acc) floats
    // Query strips (plan::KeyMajorPlan::query_strips): the key tiles' rows' tokens ([k_tiles * 64], -1 padding) and
    // the strips' token strides; entries {strip, mask, base token, strip_pack}; q_tiles then counts the 64-row tiles
    // of the query length (lse2, delta, dq_acc in token order). Null: no strips.
    const int32_t* k_map = nullptr;
    int strip_sx = 0, strip_sy = 0;
    plan::ListShape shape;  // of the key tiles' lists (plan::list_shape; run-time lists: as their runner says)
    // One int of device memory, the persistent D = 64 grid's item counter (zeroed by launch() on the stream before the
    // tile kernel, so lists with one counter run on one stream at a time); null: a CTA a key tile.
    int* work_counter = nullptr;
    // dQ's first writers (plan::dq_owners: [q_tiles]) and their flags (B Hq q_tiles ints), where the plan has them;
    // used on the D = 128 row's persistent grid: BwdParams::dq_owner. Null: prep zeroes the accumulator.
    const int32_t* dq_owner = nullptr;
    int* dq_ready = nullptr;
    bool dq_rev = false;
  };
  // The warp-specialized rows, where they write dK and dV through shared memory and have an item counter, run a
  // persistent grid (CTAs an SM x SMs, each taking key tiles from a counter, the next tile's K and V loaded before the
  // last one's dK / dV epilogue; tile_bwd_ws2.cuh).
  // For tests: such launches so far, the last one's grid, and that grid's CTAs (0: the SMs'; at most the items;
  // returns the previous value): fewer, so that small problems give each CTA several items, or more than the SMs, so
  // that some CTAs start only once others have ended.
  static int64_t persistent_launches();
  static int last_persistent_grid();
  static int set_persistent_grid_limit(int limit);
  // run()'s launches for `lists` and kernel-table row `row` (requires refusal(...) == ""); returns the row launched
  // (a warp-specialized row without tensor maps runs the sm90_bwd 64x128 row) and sets *tma; dq_accumulate and
  // dkv_accumulate as run()'s.
  static int launch(const Problem& problem, int row, const DeviceLists& lists, const TensorView& q, const TensorView& k,
                    const TensorView& v, const TensorView& o, const TensorView& lse, const TensorView& dout,
                    const TensorView& dq, const TensorView& dk, const TensorView& dv, void* stream, bool* tma,
                    bool dq_accumulate = false, bool dkv_accumulate = false);

  // For tests: the tile backward's launches in this process so far (each a prep, the tile kernel and a finish), and
  // of those the ones with 16-byte O loads (prep) and dq stores (finish).
  struct PrepFinCounts {
    int64_t launches = 0, o16 = 0, dq16 = 0;
  };
  static PrepFinCounts prepfin_counts();
  // For tests: the warp-specialized launches in this process that wrote dK and dV through shared memory and TMA
  // stores (tile_bwd.cuh, store_dkdv_smem; not where they are added to).
  static int64_t smem_epilogue_launches();
  // For tests: the launches in this process whose finish ran bwd_finish_tile_kernel (the warp-specialized rows'
  // accumulator orders), and of those the ones adding to dq (dq_accumulate).
  struct FinishTileCounts {
    int64_t launches = 0, accumulate = 0;
  };
  static FinishTileCounts finish_tile_counts();
  // For tests: the launches in this process whose owners stored dQ's first writes (BwdParams::dq_owner), and the
  // owners' use for plans built and launched after the call (1, the default: where plan::dq_owners' rule admits them;
  // 0: never; 2: wherever every query tile has a key, any_waits); returns the previous mode.
  static int64_t dq_owner_launches();
  static int set_dq_owner_mode(int mode);
  // The prep / finish grids' most batches and query heads a launch (grid z and y; 65535, CUDA's limit): more are split
  // into launches of at most that many. Tests lower it to run the split; returns the previous limit.
  static int set_prepfin_grid_limit(int limit);

  int kernel_row() const;  // plan/kernels.hpp: the row the last run launched (before any: the chosen one)
  bool last_tma() const { return last_tma_; }  // whether the last run loaded its steps by TMA (else cp.async)
  bool query_strips() const { return strips_; }  // the plan is over query strips
  std::string explain() const;

 private:
  Problem problem_;
  int row_ = -1;
  plan::BlockPlan plan_;  // the forward-order plan (its entries are kept for explain; the device has them key-major)
  int64_t nbitmask_ = 0;
  plan::ListShape shape_;  // plan::list_shape of the key-major plan
  bool strips_ = false;        // query strips: the device lists are key_major_strips'
  std::string strips_desc_;    // ... described (plan_ is then empty)
  int64_t strip_k_tiles_ = 0;  // ... their key tiles
  int32_t strip_sx_ = 0, strip_sy_ = 0;
  DeviceBuffer col_offsets_, entries_, masks_, order_, k_map_;
  DeviceBuffer dq_acc_, lse2_, delta_;
  DeviceBuffer work_counter_;  // DeviceLists::work_counter
  DeviceBuffer dq_owner_, dq_ready_;  // DeviceLists::dq_owner, dq_ready (empty: plan::dq_owners found none)
  bool dq_rev_ = false;
  mutable bool last_tma_ = false;
  mutable int ran_row_ = -1;  // a warp-specialized row without TMA runs the 64x128 row of its head dim
};

}  // namespace spattn::cuda
