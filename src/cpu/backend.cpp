// cpu/backend.cpp — the CPU engines behind spattn::Plan: the fused CPU kernel and the fp64 reference.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <sstream>

#include "cpu/compound.hpp"
#include "cpu/fused_plan.hpp"
#include "plan/backend.hpp"
#include "spattn/reference.hpp"

namespace spattn::plan {
namespace {

// A per-distinct-pattern list (patterns, analyses) as the CPU engines take it: one entry for all heads, or one per
// query head.
template <class T>
std::vector<T> per_head(const Planned& p, const std::vector<T>& distinct) {
  if (!p.per_head()) return {distinct[0]};
  std::vector<T> out;
  for (int i : p.of_head) out.push_back(distinct[size_t(i)]);
  return out;
}

cpu::Isa parse_isa(const std::string& kernel) {
  if (kernel.empty() || kernel == "cpu_fused") return cpu::Isa::automatic;
  for (cpu::Isa isa : {cpu::Isa::avx512, cpu::Isa::avx2, cpu::Isa::generic})
    if (kernel == cpu::isa_name(isa)) return isa;
  throw Error("kernel '" + kernel + "' is not a CPU kernel: expected cpu_fused, avx512, avx2 or generic");
}

// A compound plan (plan/parts.hpp) for one pattern shared by every head, where asked (PlanOptions::compound 1) and
// the split finds parts; chosen (compound -1) only as the affine split (issue 42: the strided term of sparse_strided
// grouped by residue beside its band, SplitTarget::affine_cpu's rule); else none. The other parts are not chosen:
// the CPU tiler already runs scattered keys as residue rows beside its key blocks, and the parts with their merge
// measured slower (2-core VM, L=4096, H=4, D=64, fp32: sparse_fixed(128) 3.77 vs 2.50 ms, local(64)|random(4) 5.86
// vs 3.14; random(20) alone 2.29 vs 2.77).
std::optional<cpu::CompoundPlan> compound_of(const Planned& p, const Problem& problem, const PlanOptions& o,
                                             const cpu::Options& co) {
  if (p.per_head() || (o.compound != 1 && o.compound != -1)) return std::nullopt;
  if (o.compound == -1) {  // terms of the tiles only, one of them dilated (no other part's lists built for nothing)
    bool dilated = false;
    for (const BoundPattern& t : p.patterns[0].union_terms()) {
      if (t.shape() != BoundPattern::Shape::general) return std::nullopt;
      const auto db = t.dilated_band();
      dilated = dilated || (db && db->d >= 2);
    }
    if (!dilated) return std::nullopt;
  }
  SplitTarget target;
  target.affine_cpu = o.compound == -1;
  plan::Split split = split_pattern(p.patterns[0], p.analyses[0], o.compound, target);
  if (!split.compound()) return std::nullopt;
  if (o.compound == -1 && (split.parts.size() != 2 || split.parts[1].kind != PartKind::affine)) return std::nullopt;
  return cpu::CompoundPlan(std::move(split), problem, co);
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Planned& p, const Problem& problem, const PlanOptions& o)
      : options_{o.threads, parse_isa(o.kernel), o.split < 0 ? 0 : std::max(1, o.split)}, problem_(problem),
        pats_(per_head(p, p.patterns)), analyses_(per_head(p, p.analyses)),
        compound_(compound_of(p, problem, o, options_)) {
    if (!compound_) plan_.emplace(pats_, problem, options_, analyses_);
  }

  void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView& lse, Stream) const override {
    if (compound_)
      compound_->run(q, k, v, o, lse, options_);
    else
      plan_->run(q, k, v, o, lse, options_);
    ran_.store(true, std::memory_order_relaxed);
  }
  void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o, const TensorView& lse,
                const TensorView& dout, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                Stream) const override {
    // A compound plan's backward runs on one tile list over the whole pattern, planned at the first call: with the
    // merged LSE every part's P is exact (docs/KERNELS.md section 4), so the parts need no backward of their own.
    // The affine split's parts run by parts (the band's plan writing the gradients, the lattice's adding its own) were
    // no faster (2-core VM, one thread, fp32, H = 4, D = 64, CPU time: sparse_strided(256) at L = 16384 124 vs 127-132
    // ms, (128) at 8192 48 vs 49, (512) at 16384 163-168 vs 153-157), and a part's fp64 redo of non-finite values
    // sees only its own keys.
    // Nor the GPU's other parts (issue 39; same VM, one thread, fp32, H = 4, D = 64, medians): the tiler already
    // holds column strips (sparse_fixed's summaries, sinks, global columns) and bigbird's blocks as key blocks
    // (computed / nnz 1, no residue), so the backward runs at its forward's effective rate or above (L = 4096, GFLOP/s
    // fwd vs bwd: sparse_fixed(128, 4) 103 vs 110, bigbird(64, 3, 2, 3) 159 vs 170, (local(left=2048, right=0) |
    // global_cols(0:4)) & causal 129 vs 163, local(256) | random(8) 93 vs 108, longformer(256, 2) 106 vs 118). Only
    // residue keys cost more than their share (L = 16384, perf: 24% of local(256) | random(8)'s backward for 2.4% of
    // its scores, 3% of longformer(256, 2)'s): random row accesses. The scattered keys' backward on the transposed
    // lists (P and dS listed by the tiles, each key's dK / dV summed once: git history, "residue rows by keys") was
    // no faster, by keys / tiles 0.97-1.13 (random(8) and local(256) | random(8) at L = 16384, random(205) at 4096);
    // the scattered part as a plan of its own costs its packing again (local(256) | random(8) at L = 16384: 222 ms
    // whole, local(256) 177 + random(8) 61 apart).
    if (compound_) std::call_once(bwd_once_, [&] { bwd_plan_.emplace(pats_, problem_, options_, analyses_); });
    const cpu::FusedPlan& plan = compound_ ? *bwd_plan_ : *plan_;
    const std::string ran = plan.backward(q, k, v, o, lse, dout, dq, dk, dv, options_).describe();
    std::lock_guard<std::mutex> lock(mu_);
    last_backward_ = ran;
  }
  std::string kernel() const override {
    return std::string("cpu_fused_") + (compound_ ? compound_->stats() : plan_->stats()).isa;
  }
  std::string last_kernel() const override { return ran_.load(std::memory_order_relaxed) ? kernel() : ""; }
  // What the backward runs, and why not by parts (backward() says what was measured).
  std::string backward_text() const {
    if (compound_)
      return "backward: one tile plan over the whole pattern, built at the first call (not by parts: the parts' "
             "backward measured no faster)";
    if (plan_->stats().residue_nnz == 0)
      return "backward: on the forward's tiles over the whole pattern (not by parts: every kept score is in the tiles' "
             "key blocks, column strips and long rows too; no residue rows)";
    return "backward: on the forward's tiles over the whole pattern, residue rows one at a time (not by parts: column "
           "strips are key blocks of the tiles; the residue keys by a pass over their transposed lists measured no "
           "faster)";
  }
  std::string last_backward_kernel() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return last_backward_;
  }
  std::string explain() const override {
    return "cpu fused: " + (compound_ ? compound_->describe() : plan_->describe()) + "\n" + backward_text();
  }

 private:
  cpu::Options options_;
  Problem problem_;
  std::vector<BoundPattern> pats_;
  std::vector<Analysis> analyses_;
  std::optional<cpu::CompoundPlan> compound_;
  std::optional<cpu::FusedPlan> plan_;
  mutable std::atomic<bool> ran_{false};
  mutable std::once_flag bwd_once_;
  mutable std::optional<cpu::FusedPlan> bwd_plan_;  // compound plans: the backward's tile list
  mutable std::mutex mu_;
  mutable std::string last_backward_;
};

class ReferenceBackend final : public Backend {
 public:
  ReferenceBackend(const Planned& p, const Problem& problem) : problem_(problem), pats_(per_head(p, p.patterns)) {}

  void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView& lse, Stream) const override {
    cpu::reference_attention(pats_, problem_, q, k, v, o, lse);
    ran_.store(true, std::memory_order_relaxed);
  }
  void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView&, const TensorView&,
                const TensorView& dout, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                Stream) const override {
    cpu::reference_attention_backward(pats_, problem_, q, k, v, dout, dq, dk, dv);
    ran_backward_.store(true, std::memory_order_relaxed);
  }
  std::string kernel() const override { return "reference"; }
  std::string last_kernel() const override { return ran_.load(std::memory_order_relaxed) ? kernel() : ""; }
  std::string last_backward_kernel() const override { return ran_backward_.load(std::memory_order_relaxed) ? kernel() : ""; }
  std::string explain() const override { return "reference: fp64, every (q, k) tested by the pattern's predicate"; }

 private:
  Problem problem_;
  std::vector<BoundPattern> pats_;
  mutable std::atomic<bool> ran_{false}, ran_backward_{false};
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Planned& p, const Problem& problem, const PlanOptions& options) {
  return std::make_unique<CpuBackend>(p, problem, options);
}
std::unique_ptr<Backend> make_reference_backend(const Planned& p, const Problem& problem) {
  return std::make_unique<ReferenceBackend>(p, problem);
}

}  // namespace spattn::plan
