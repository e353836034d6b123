// cpu/fused_plan.hpp — the CPU backend of spattn::Plan (include/spattn/plan.hpp): the fused, multi-threaded
// CPU attention, cost proportional to the pattern's nonzeros.
//
// Semantics are PATTERNS.md's, exactly those of spattn::cpu::reference_attention (the oracle it is tested
// against): q [B, Lq, Hq, D], k [B, Lk, Hkv, D], v [B, Lk, Hkv, Dv] in fp32, fp16 or bf16 (one dtype for
// all three), any element strides; o [B, Lq, Hq, Dv] fp32; lse [B, Hq, Lq, 1] fp32 or a view with a null data
// pointer (not written). Grouped-query attention (Hq % Hkv == 0), Dv != D and a custom scale
// (Problem::scale) are supported. A fully masked row gives O = 0 and lse = -inf. fp32 accumulation; a row that
// meets a non-finite value or a score past fp32's range is redone in fp64 (PATTERNS.md's semantics for them).
// Bad shapes, dtypes or lengths throw spattn::Error naming the value.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "plan/analysis.hpp"
#include "plan/tile_map.hpp"
#include "spattn/pattern.hpp"
#include "spattn/tensor.hpp"

namespace spattn::cpu {

// Which compiled kernel set runs. automatic: the widest the CPU supports (AVX-512, then AVX2+FMA, then the
// portable 4-wide kernels). Forcing a set the CPU lacks throws Error.
enum class Isa { automatic, avx512, avx2, generic };
const char* isa_name(Isa isa);
// The set `automatic` picks on this machine.
Isa best_isa();

struct Options {
  int threads = 0;  // worker threads; 0: all hardware threads
  Isa isa = Isa::automatic;
  // Backward: slices per (batch, kv head) group, each with its own dK / dV partials added at the end (0: chosen,
  // 1: none; for tests and benchmarks).
  int split = 0;
};

// What one FusedPlan::backward call ran.
struct BackwardStats {
  std::string isa;
  int64_t groups = 0;        // (batch, kv head) groups
  int64_t exact_groups = 0;  // of which redone in fp64 (cpu/backward.hpp): non-finite values, fp32's range
  int split = 1;             // slices per group
  bool recomputed = false;   // O or the LSE was not given: the forward ran first
  // "cpu_fused_avx512", then where they apply "; split 2", "; fp64 for 1 of 4 groups", "; forward recomputed".
  std::string describe() const;
};

// What a plan holds, for explain/bench output.
struct PlanStats {
  int64_t tiles = 0;          // query tiles per head (per pattern)
  int tile_rows = 0;          // query rows per tile
  int permutation = 1;        // residue grouping d (dilated/strided patterns run in d groups), 1: none
  // Query tiles as boxes of a neighborhood grid (plan/tile_map.hpp; tile_box.volume() == tile_rows): their
  // description ("4x8 boxes of a 33x50 grid"), empty where tiles are runs of consecutive (or residue) tokens.
  std::string boxes;
  plan::TileBox tile_box;
  int64_t nnz = 0;            // kept (q, k) per head, summed over distinct patterns
  int64_t dense_scores = 0;   // scores computed in dense key blocks (tile rows x block keys)
  int64_t masked_scores = 0;  // of which in blocks that carry a row mask
  int64_t residue_nnz = 0;    // scores computed one row at a time (scattered parts)
  double build_ms = 0;
  std::string isa;
};

// The pattern analysed for one problem shape: per query tile, the key blocks every row of the tile visits
// (full or with a row mask) and the per-row residue runs. Built in O(tiles + runs) (plus the keys of runs
// that are neither intervals nor on the permutation's lattice). Immutable; run() is thread-safe.
class FusedPlan {
 public:
  // `patterns`: one for all heads or one per query head, each bound to (problem.q_len, problem.kv_len).
  // Options::threads is used to build the plan; Options::isa fixes the kernel set (and the tile height).
  // `analyses`: plan::analyze of each pattern where the caller has them (make_plan); empty: computed here.
  FusedPlan(const std::vector<BoundPattern>& patterns, const Problem& problem, const Options& options = {},
            const std::vector<plan::Analysis>& analyses = {});
  ~FusedPlan();
  FusedPlan(FusedPlan&&) noexcept;
  FusedPlan& operator=(FusedPlan&&) noexcept;

  // Runs the attention. The views must match the plan's problem (shapes; dtype of q/k/v may be any of
  // fp32/fp16/bf16 and need not equal problem.dtype).
  void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o, const TensorView& lse,
           const Options& options = {}) const;
  // The gradients of run() (fused_backward.cpp): dq [B, Lq, Hq, D], dk [B, Lk, Hkv, D], dv [B, Lk, Hkv, Dv] fp32
  // or fp64 (overwritten) from dout [B, Lq, Hq, Dv]; q/k/v/dout fp32, fp16, bf16 or fp64 (converted to fp32), any
  // strides. o [B, Lq, Hq, Dv] (any dtype) and lse [B, Hq, Lq, 1] (fp32 or fp64) from the forward; where either
  // has a null data pointer, run() computes both first. fp32 accumulation; a (batch, kv head) group whose fp32
  // gradients are not all finite (non-finite inputs, scores past fp32's range) or with an LSE past 2^14 (base 2) is
  // recomputed in fp64 (the reference's semantics for non-finite values).
  BackwardStats backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                         const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                         const TensorView& dv, const Options& options = {}) const;

  const Problem& problem() const;
  const PlanStats& stats() const;
  std::string describe() const;
  // A hash of what the kernels read (every tile's query rows, key blocks, row masks, residue lists with their
  // padding and key passes, the work items and their order) and of stats() but its time: two plans with one
  // fingerprint run the same work. For tests that check that two ways of building give one plan.
  uint64_t fingerprint() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Plans and runs in one call.
void attention(const std::vector<BoundPattern>& patterns, const Problem& problem, const TensorView& q,
               const TensorView& k, const TensorView& v, const TensorView& o, const TensorView& lse,
               const Options& options = {});

}  // namespace spattn::cpu
