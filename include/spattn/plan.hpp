// spattn/plan.hpp — the one way to run sparse attention: plan once, run many times, on the CPU or a GPU.
//
//   spattn::Problem problem{.batch = 2, .q_heads = 16, .kv_heads = 16, .q_len = 4096, .kv_len = 4096,
//                           .head_dim = 64, .dtype = spattn::DType::bf16};
//   spattn::Plan plan = spattn::make_plan(spattn::parse("longformer(256, 32)"), problem, spattn::Device::cuda(0));
//   std::cout << plan.explain();                  // the analysis, the engine and kernel chosen, and why
//   plan.forward(q, k, v, o, lse, stream);        // TensorViews; no hidden allocation; relaunchable
//
// make_plan analyses each distinct pattern once (plan/analysis: keys a row, band rows, residue strides, neighborhood
// grids), hands the analysis to the engine's tiler, and picks a kernel from the one kernel table
// (plan/kernels.hpp). The plan is immutable and reusable; forward() checks every tensor against the problem the
// plan was built for and throws spattn::Error naming the tensor, the dimension and both values on a mismatch.
//
// Engines (PlanOptions::engine; `automatic` picks the first that takes the problem):
//   cpu_fused     the CPU: q/k/v fp32, fp16 or bf16, any strides; o and lse fp32. All cores by default.
//   cuda_fused    an NVIDIA GPU (sm_80+, the measured path sm_90a): q/k/v/o bf16 or fp16 device memory with a
//                 contiguous head dim, head dim 64 or 128, value dim = head dim; lse fp32 [B, Hq, Lq].
//                 Relaunchable on one stream and capturable in a CUDA graph (one plan per concurrent stream).
//   cuda_unfused  an NVIDIA GPU: SDDMM -> sparse softmax -> SpMM (BSR blocks on tensor cores, CSR elements on
//                 CUDA cores); f32 too, head dims multiples of 8 up to 256; o in the input dtype. Needs a workspace
//                 that the plan owns (allocated at make_plan).
//   reference     the fp64 oracle on the CPU (any dtype in, o/lse f32 or f64): straight from the pattern's
//                 predicate, O(Lq * Lk) — for checking, never for speed.
//
// Layout: q [B, Lq, Hq, D], k [B, Lk, Hkv, D], v [B, Lk, Hkv, Dv], o [B, Lq, Hq, Dv], lse [B, Hq, Lq] (shape
// {B, Hq, Lq, 1}), natural log; any strides a TensorView expresses ([B, H, L, D] storage too). Hq % Hkv == 0
// (grouped-query attention). A query row that keeps no key gives O = 0 and LSE = -inf.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "spattn/engine.hpp"
#include "spattn/format.hpp"
#include "spattn/pattern.hpp"
#include "spattn/tensor.hpp"

namespace spattn {

struct RuntimeMask;  // spattn/runtime_mask.hpp

// Where a plan runs.
struct Device {
  enum class Kind : uint8_t { cpu, cuda };
  Kind kind = Kind::cpu;
  int index = 0;

  static Device cpu() { return {}; }
  static Device cuda(int index = 0) { return {Kind::cuda, index}; }
  // "cpu", "cuda", "cuda:1"; throws Error naming the text otherwise.
  static Device parse(std::string_view text);
  std::string str() const;
  bool operator==(const Device&) const = default;
};

// A CUDA stream (cudaStream_t) for GPU plans; null is the legacy default stream. Ignored on the CPU.
using Stream = void*;

std::string_view engine_name(Engine e);
Engine parse_engine(std::string_view name);  // "auto", "cpu", "cuda_fused", "cuda_unfused", "reference"

struct PlanOptions {
  Engine engine = Engine::automatic;
  int threads = 0;  // CPU engine: worker threads (0: all hardware threads)
  // Force a kernel of the table (plan/kernels.hpp) by row name ("sm90_tma_128x128_d64") or by kind ("sm80",
  // "sm90_cp", "sm90_tma", "sm90_band", "sm90_band_rmax"; for the CPU "avx512", "avx2", "generic"). Empty:
  // chosen. A name that does not exist, or whose kernel cannot run the problem, is refused by make_plan.
  std::string kernel;
  int block_m = 0, block_n = 0;  // fused GPU tile shape (0: chosen)
  int perm_d = -1;               // residue permutation (-1: chosen, 1: none)
  // Neighborhood patterns of 2-3 axes on the fused GPU engine: query and key tiles as boxes of the token grid
  // through a row map (multi-dimensional tiles): -1 chosen by predicted cost, 0 never, 1 always (refused without
  // such a grid), 2 key strips (64x64 tiles whose key tiles are strips of each query box's window union; refused,
  // saying why, where they do not fit). Mapped plans run on the cp.async / mma.sync kernels.
  int tile_map = -1;
  // Fused GPU scheduling, for tests and benchmarks (-1: chosen): TMA/band kernels' persistent CTAs (1 / 0);
  // the band kernel's split of work items (0 never, 1 last items as slabs, 2-4 parts over keys). The CPU
  // engine's backward: each (batch, kv head) group cut into `split` slices with their own dK / dV partials
  // (0 or 1: none).
  int persistent = -1, split = -1;
  // Compound plans (parts run by their own kernels, merged through the LSE; `explain` lists them): -1 chosen by
  // the planner's rules (plan/parts.hpp), 0 never (one tile list), 1 every column, row and scattered term split
  // out whatever its size. The fused GPU engine splits by default; the CPU engine with 1, and with -1 only a lattice
  // beside a band (sparse_strided's strided term grouped by residue, where its groups are long: plan/parts.hpp,
  // kCpuAffineMinGroup; its tiler already runs scattered keys as residue rows, faster than parts and a merge); the
  // others ignore it.
  int compound = -1;
  // The GPU backward's kernel (Plan::backward): "" chosen (the sm_90a tensor-core tiles where the tensors allow,
  // else the CUDA-core CSR pass), "sm90_bwd" (or one of its rows, sm90_bwd_64x64_d64 ...; an Error where it cannot run the
  // tensors), "sm90_bwd_ws" (the warp-specialized rows, chosen where steps come by TMA: sm90_bwd_ws_128x128_d64, 128
  // queries a step, and sm90_bwd_ws_64x128_d128; plans with a residue permutation run the sm90_bwd 64x128 row instead,
  // and last_backward_kernel says so), "cuda_csr_bwd" (deterministic: no atomics), "sm90_bwd_strips" (neighborhood
  // patterns of a 1-2 axis grid: key boxes walking strips of the queries that see them, on the 64x64 sm90_bwd row of the
  // head dim; an Error where the strips do not fit; chosen for 2-D neighborhoods, where "sm90_bwd" or "sm90_bwd_ws"
  // runs the row-major tile plan instead).
  std::string backward_kernel;
};

class Plan {
 public:
  Plan();
  ~Plan();
  Plan(Plan&&) noexcept;
  Plan& operator=(Plan&&) noexcept;

  const Problem& problem() const;
  const Device& device() const;
  Engine engine() const;
  int64_t nnz() const;            // kept (q, k) pairs over all query heads (per batch element)
  double plan_ms() const;         // make_plan's time: analysis, tiling, upload
  std::string kernel() const;     // the kernel-table row the plan chose (per-head plans: the first head's)
  std::string last_kernel() const;  // the row the last forward launched ("" before the first); it differs
                                    // from kernel() only where the tensors' strides admit no tensor map
  // What was chosen and why: the pattern analysis, engine, kernel, tiles, predicted cost, plan time.
  std::string explain() const;

  // O (and LSE where lse.data is not null) for the problem the plan was built for. GPU engines enqueue on
  // `stream` and return; the CPU engines return when done.
  void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView& lse, Stream stream = nullptr) const;
  // dQ, dK, dV (overwritten) from dout [B, Lq, Hq, Dv]. CPU engines: dq/dk/dv fp32 or fp64, q/k/v/dout any
  // dtype; o (any dtype) and lse (fp32 or fp64) from the forward, or null data. cpu_fused: the fused backward
  // (FlashAttention-2's on the forward's tiles, fp32 accumulation, all cores); with o or lse missing it runs the
  // forward first; groups meeting a non-finite value are redone in fp64. reference: the fp64 oracle, the softmax
  // recomputed from q and k (o and lse ignored). GPU engines: every tensor in the plan's dtype, o and lse from the
  // forward required. On an sm_90a device with bf16 / fp16 at head dim 64 or 128: tensor-core tiles, key-major (dK,
  // dV on chip; dQ added up by fp32 atomics, so not bit-reproducible); elsewhere (or PlanOptions::backward_kernel
  // "cuda_csr_bwd") a deterministic CUDA-core pass over the pattern's CSR and its transpose. The fused GPU engine runs
  // a compound plan's backward by parts where no backward kernel is forced (explain lists them): each part against
  // the forward's LSE, the first part writing dQ, dK, dV and the others adding theirs (tiles and gathered columns on
  // the tiles, scattered keys on cuda_scattered_bwd: eight lanes a row, dK/dV over the transposed CSR, no atomics).
  // Built at the first call; runs of one plan's backward share scratch:
  // one stream at a time.
  void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, Stream stream = nullptr) const;
  // What the last backward ran ("" before the first): "reference"; "cpu_fused_<isa>" followed, where they
  // apply, by "; split N" (slices per (batch, kv head) with dK/dV partials), "; fp64 for G of N groups" and
  // "; forward recomputed"; on the GPU engines the kernel-table row (sm90_bwd_64x64_d64, ..., cuda_csr_bwd), or
  // "parts(ROW+ROW...)" where a compound plan ran by parts (each part's row, in run order).
  std::string last_backward_kernel() const;

  // Plans of run-time masks (make_plan(MaskLayout), spattn/runtime_mask.hpp): forward and backward with the call's
  // mask; the overloads above throw Error for them, these for plans of static patterns.
  void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView& lse, const RuntimeMask& mask, Stream stream = nullptr) const;
  void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, const RuntimeMask& mask, Stream stream = nullptr) const;
  bool takes_mask() const;  // built by make_plan(MaskLayout)

  struct Impl;
  explicit Plan(std::unique_ptr<Impl> impl);  // make_plan's

 private:
  std::unique_ptr<Impl> impl_;
};

// One pattern for every head, or one per query head (patterns.size() == problem.q_heads); each is bound to
// (problem.q_len, problem.kv_len). Throws Error naming the offending value (problem fields, dtype or head dim
// the engine does not take, an unknown kernel, a device that does not exist).
Plan make_plan(const std::vector<Pattern>& patterns, const Problem& problem, Device device = Device::cpu(),
               const PlanOptions& options = {});
inline Plan make_plan(const Pattern& pattern, const Problem& problem, Device device = Device::cpu(),
                      const PlanOptions& options = {}) {
  return make_plan(std::vector<Pattern>{pattern}, problem, device, options);
}
// Patterns already bound to (problem.q_len, problem.kv_len), one or one per query head: a window of a larger pattern
// (BoundPattern::window: a rank's sub-problem under context parallelism, spattn/distributed.hpp), an explicit one.
// Every engine takes them (they have no spec terms: the planner reads their rows). Throws Error naming a pattern
// bound to other lengths.
Plan make_plan(const std::vector<BoundPattern>& patterns, const Problem& problem, Device device = Device::cpu(),
               const PlanOptions& options = {});
// A mask the caller already holds (a DeepSpeed layout, a FlexAttention block mask exported to indices), as
// CSR over (q_len x kv_len) or BSR (expanded to its kept entries), validated first: the error names the first
// bad row or entry.
Plan make_plan(const Csr& mask, const Problem& problem, Device device = Device::cpu(), const PlanOptions& options = {});
// A floor of the host memory the plan of `patterns` (bound as make_plan's) takes, in bytes, found without building
// it: the fused CPU engine's tiles hold at least 24 bytes a query row for each run of a row (measured: local(2)
// 25 bytes a row at L = 2^24, longformer(128, 16) 80, random(4) 3 KB); the runs a row counted on 64 rows spread
// over the queries; 0 on other engines. make_plan refuses (an Error with the figure and host_memory_limit()) a
// problem whose floor exceeds the limit, before the analysis walks the rows.
int64_t plan_host_bytes_floor(const std::vector<BoundPattern>& patterns, const Problem& problem,
                              Device device = Device::cpu(), const PlanOptions& options = {});
Plan make_plan(const Bsr& mask, const Problem& problem, Device device = Device::cpu(), const PlanOptions& options = {});

}  // namespace spattn
