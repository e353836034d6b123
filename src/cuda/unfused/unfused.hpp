// cuda/unfused/unfused.hpp — the unfused GPU engine (Multigrain): SDDMM, compound sparse softmax, SpMM; behind
// spattn::Plan as Engine::cuda_unfused (plan/backend.hpp), and the building blocks the bench and tests time.
//
// A pattern is split once, on the host, into two parts that never overlap:
//   coarse: BSR blocks (32 or 64 square) whose density reaches `coarse_min_density`; computed on tensor
//           cores as whole tiles; a partial block carries a bitmask (masked entries are stored as 0);
//   fine:   every other kept (q, k), as CSR; computed on CUDA cores, one warp per row or row slice, or,
//           where it fills enough of its occupied 64x64 tiles (Options::fine_tc_min_fill), on tensor cores:
//           the whole tile is computed from shared-memory Q/K (or P/V) tiles, only kept entries stored.
// In a plan with both parts, SDDMM runs them concurrently on two streams (the caller's stream and a side
// stream the plan owns, joined back with events, so a run can be captured in a CUDA graph); SpMM adds the
// fine entries of a block row in the coarse kernel's epilogue (no partial buffers, no merge).
// The softmax is one kernel over both parts.
// attention() without P on a fine-only tensor-core plan with D == Dv in {64, 128} runs one fused kernel
// instead (flash-style over the occupied 128-row x 64-key tiles: no S or P in memory, no workspace);
// with P requested it always runs SDDMM -> softmax -> SpMM (on a fine-only tensor-core plan with S and P kept in
// the tiles' order in the workspace between the steps, and P also written to the caller's CSR-ordered array).
//
// Sparse values (scores S, probabilities P) live in two arrays per (batch, query head), bh = b * Hq + h:
//   coarse: [B * Hq][coarse_blocks][block][block] row-major inside a block, block order of coarse_bsr();
//   fine:   [B * Hq][fine_nnz] in the order of fine_csr().
// S and P have the input dtype (fp32 accumulation, rounded once); S is unscaled (S = Q K^T, as cuSPARSE's
// SDDMM with alpha = 1).
// LSE is fp32 [B, Hq, Lq], natural log, of the scaled scores; a fully masked row gives P = 0, O = 0 and
// LSE = -inf.
//
// Inputs follow PATTERNS.md: Q [B, Lq, Hq, D], K [B, Lk, Hkv, D], V [B, Lk, Hkv, Dv], O [B, Lq, Hq, Dv];
// any strides with a unit innermost stride and 16-byte aligned rows. dtypes: bf16 and f16 (coarse on tensor
// cores, fp32 accumulation) and f32 (CUDA cores only: an f32 plan has no coarse part). D and Dv: multiples
// of 8 (16 where a coarse part exists), at most 256 (128 for f32).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "spattn/format.hpp"
#include "spattn/pattern.hpp"
#include "spattn/plan.hpp"  // spattn::Stream: a cudaStream_t, null for the legacy default stream
#include "spattn/tensor.hpp"

namespace spattn::unfused {

struct Options {
  int block = 32;                     // coarse block size: 32 or 64 (32: SDDMM 6.3x vs 4.9x cuSPARSE geomean on H100, SpMM 11.8x vs 14.7x)
  double coarse_min_density = 0.1;    // a block with at least this share of its area kept goes coarse
  // Forcing, for tests and benchmarks: every nonempty block coarse, or everything fine.
  enum class Split : uint8_t { automatic, all_coarse, all_fine } split = Split::automatic;
  int fine_slice = 256;               // SDDMM fine: longest row slice one warp takes (load balance)
  // bf16/f16 with D % 16 == 0: the fine part runs on tensor cores over its occupied 64x64 (query, key) tiles
  // when its kept entries fill at least this share of them (random(L/20): 0.05; sparse_fixed's residue
  // 0.008). Above ~0.02 the whole tile on tensor cores costs less than a 128-byte L2 fetch per entry.
  double fine_tc_min_fill = 0.03;
  // attention() without P on a fine-only tensor-core plan with D == Dv in {64, 128}: one fused flash-style
  // kernel (attention_fine_tc) when true, else SDDMM -> SpMM as with P (for benchmarks and tests).
  bool fused_fine_attention = true;
};

// The split of one pattern, on the host (no CUDA needed): what the plan uploads.
struct Split {
  int64_t q_len = 0, k_len = 0;
  int block = 0;
  // Coarse part. masks hold block*block/64 words per partial block, bit r*block + c.
  Bsr coarse;
  // Fine part: CSR of the kept (q, k) outside every coarse block.
  Csr fine;
  int64_t nnz = 0;          // kept (q, k) in the pattern (coarse kept + fine)
  int64_t coarse_nnz = 0;   // kept entries inside coarse blocks
  std::string describe() const;
};

// Splits a bound pattern (walks each row's runs once; cost follows rows x blocks touched, not Lq x Lk).
Split split_pattern(const BoundPattern& pattern, const Options& options, DType dtype);

// Values of a sparse matrix in the plan's split layout (see above). Either part may be null when the plan
// has no entries in it.
struct SparseValues {
  void* coarse = nullptr;
  void* fine = nullptr;
};

// The unfused engine's plan: a split uploaded to the current CUDA device, for one Problem (what
// Engine::cuda_unfused runs behind spattn::Plan). Immutable after build; a run may be relaunched, and captured in
// a CUDA graph. Not to be run concurrently with itself (it owns one side stream and two events).
class UnfusedPlan {
 public:
  // Throws spattn::Error naming the offending value (problem fields, dtype, head dims, block size).
  static UnfusedPlan build(const BoundPattern& pattern, const Problem& problem, const Options& options = {});

  const Problem& problem() const;
  const Split& split() const;
  std::string explain() const;

  bool has_coarse() const;
  bool has_fine() const;
  // Element counts of one sparse value array, per (b, h) and in all.
  int64_t coarse_elems_per_head() const;  // coarse_blocks * block * block
  int64_t fine_elems_per_head() const;    // fine nnz
  int64_t score_bytes() const;            // S for all heads (input dtype)
  int64_t prob_bytes() const;             // P for all heads (input dtype)

  // Workspace of each op in bytes (the caller owns it; 256-byte aligned; none is allocated here).
  int64_t sddmm_workspace_size() const { return 0; }
  int64_t softmax_workspace_size() const { return 0; }
  int64_t spmm_workspace_size() const;       // 0 (kept for callers sizing workspaces)
  // Bytes attention() needs: S, and P unless given (on a fine-only tensor-core plan, one buffer holding S and
  // then P in the tiles' order); 0 where attention without P is one fused kernel.
  int64_t attention_workspace_size(bool p_given) const;

  // S = Q K^T on the pattern (unscaled, input dtype).
  void sddmm(const TensorView& q, const TensorView& k, SparseValues s, Stream stream) const;
  // P = softmax(scale * S) per row over both parts; lse may be null.
  void softmax(SparseValues s, SparseValues p, float* lse, Stream stream) const;
  // O = P V.
  void spmm(SparseValues p, const TensorView& v, const TensorView& o, void* workspace, Stream stream) const;
  // O, LSE (and P when p.coarse / p.fine are given) of sparse attention, through the three ops.
  void attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                 float* lse, SparseValues p, void* workspace, Stream stream) const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace spattn::unfused
