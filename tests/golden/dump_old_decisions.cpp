// The golden decisions of gpu_decision_test.cpp, from the planner as it was before issue 43 moved the decision into
// src/plan/gpu: the logic of cuda/fused/backend.cpp (fused_options, the forced kind's re-plan, the split target),
// compound.cpp (the parts' options) and fused_attention.cpp (the TMA rows' availability) restated here, calling
// choose_block_plan, FusedFwd::choose_kernel and FusedFwd::choose_split as they were. Built by hand at the branch
// point (no GPU needed):
//   g++ -std=c++20 -O2 -Isrc -Iinclude -Ibuild/include -Itests -I/usr/local/cuda/include tests/golden/dump_old_decisions.cpp \
//       build/libspattn.a -L/usr/local/cuda/lib64 -lcudart -lcusparse -lcusolver -llapack -lblas -lpthread
//   ./a.out > tests/golden/gpu_decisions.txt
#define private public  // FusedFwd::choose_split
#include "cuda/fused/fused_fwd.hpp"
#undef private
#include <iostream>

#include "gpu_decision_cases.hpp"
#include "plan/key_plan.hpp"
#include "spattn/plan.hpp"
#include "plan/parts.hpp"

using namespace spattn;
using namespace spattn::plan;

namespace {

FusedOptions fused_options(const PlanOptions& o, int* want_row, int* want_kind) {  // backend.cpp, verbatim
  FusedOptions f;
  f.block_m = o.block_m;
  f.block_n = o.block_n;
  f.perm_d = o.perm_d;
  f.tile_map = o.tile_map;
  f.persistent = o.persistent;
  f.split = o.split;
  *want_row = -1;
  *want_kind = -1;
  if (o.kernel.empty()) return f;
  KernelKind kind{};
  const int row = find_kernel(o.kernel.c_str());
  if (row >= 0) {
    kind = kKernels[row].kind;
    if (!is_band(kind) && !o.block_m) f.block_m = kKernels[row].block_m, f.block_n = kKernels[row].block_n;
    *want_row = row;
  } else {
    bool found = false;
    for (KernelKind k : {KernelKind::sm80_mma, KernelKind::sm90_cp, KernelKind::sm90_tma, KernelKind::sm90_band,
                         KernelKind::sm90_band_rmax})
      if (o.kernel == kind_name(k)) kind = k, found = true;
    if (!found) throw Error("kernel not fused");
  }
  if (!is_gpu_fused(kind)) throw Error("kernel not fused");
  *want_kind = int(kind);
  f.force_sm80 = kind == KernelKind::sm80_mma;
  f.tma = kind != KernelKind::sm90_cp;
  if (kind == KernelKind::sm90_tma || is_band(kind)) f.tile_map = 0;
  f.band = is_band(kind) ? 1 : 0;
  f.running_max = kind == KernelKind::sm90_band_rmax ? 1 : 0;
  return f;
}

struct Fused {  // FusedAttention's constructor
  BlockPlan hp;
  int row;
};
Fused fused(const BoundPattern& pat, int64_t d, const FusedOptions& o, const Analysis* a, int cc) {
  const Analysis own = a ? Analysis{} : analyze(pat);
  const Analysis& an = a ? *a : own;
  const bool tma = cc == 90 && o.tma && !o.force_sm80;
  BlockPlan hp = choose_block_plan(pat, an, d, o.block_m, o.block_n, o.perm_d, tma, o.tile_map, o.device_draw != 0);
  const int row = cuda::fused::FusedFwd::choose_kernel(hp, d, cc, o);
  return {std::move(hp), row};
}

std::string text(const Fused& f, int split_option) {
  return decision_test::tiles_text(f.hp, f.row, [&](int bh) {
    cuda::fused::FusedParams k{};
    k.split_first = int(f.hp.q_tiles * bh);
    k.split_k = 1;
    k.split_slabs = 0;
    cuda::fused::FusedFwd::choose_split(f.hp, bh, 132, split_option, 132, k);
    return std::tuple<int, int, int>{k.split_first, k.split_k, k.split_slabs};
  });
}

std::string decide(const decision_test::Case& c) {
  const BoundPattern pat = parse(c.spec).bind(c.len, c.len);
  const Analysis an = analyze(pat);
  PlanOptions o;
  o.kernel = c.kernel;
  o.tile_map = c.tile_map;
  o.block_m = c.block_m, o.block_n = c.block_n;
  o.compound = c.compound;
  std::ostringstream s;
  int want_row = -1, want_kind = -1;
  const FusedOptions f = fused_options(o, &want_row, &want_kind);
  SplitTarget target;
  target.band_kernel = band_block_m(c.head_dim) > 0 && c.cc == 90 && f.tma && !f.force_sm80 && f.band != 0 &&
                       f.block_m <= 0 && f.perm_d <= 1 && f.tile_map < 1;
  target.device_draw = f.device_draw != 0;
  Split split = split_pattern(pat, an, o.kernel.empty() ? o.compound : 0, target);
  if (split.compound()) {
    FusedOptions sub;
    sub.force_sm80 = f.force_sm80;
    s << "compound";
    for (const Part& p : split.parts) {
      s << " | " << part_kind_name(p.kind) << " [" << p.terms << "] nnz " << p.nnz;
      if (p.kind == PartKind::scattered) {
        s << " drawn " << p.drawn.r << " " << p.drawn_lo << ".." << p.drawn_hi;
        continue;
      }
      FusedOptions po = p.kind == PartKind::tiles ? f : sub;
      if (p.kind == PartKind::rows) po.band = 1;
      const Fused r = fused(p.pattern, c.head_dim, po, p.kind == PartKind::tiles && p.analysis ? &*p.analysis : nullptr, c.cc);
      s << " " << text(r, po.split);
    }
  } else {
    Fused r = fused(pat, c.head_dim, f, &an, c.cc);
    if (want_kind >= 0 && want_row < 0 && !o.block_m && r.row >= 0 && int(kKernels[r.row].kind) != want_kind &&
        !is_band(KernelKind(want_kind))) {
      for (int k = 0; k < kNumKernels; ++k)
        if (int(kKernels[k].kind) == want_kind && kKernels[k].head_dim == c.head_dim) {
          FusedOptions g = f;
          g.block_m = kKernels[k].block_m, g.block_n = kKernels[k].block_n;
          r = fused(pat, c.head_dim, g, &an, c.cc);
          break;
        }
    }
    const int row = r.row;
    const bool ok = row >= 0 && (want_row < 0 || row == want_row) && (want_kind < 0 || int(kKernels[row].kind) == want_kind);
    if (!ok) return "refused (the planner's choice is " + std::string(row >= 0 ? kKernels[row].name : "none") + ")";
    s << text(r, f.split);
  }
  if (c.cc == 90 && c.kernel.empty() && c.tile_map == -1 && c.block_m == 0) {
    const int brow = choose_backward_row(an, c.head_dim, true);
    s << " || backward " << (brow >= 0 ? kKernels[brow].name : "none");
    if (brow >= 0) {
      const BlockPlan bp = choose_block_plan(pat, an, c.head_dim, 64, kKernels[brow].block_n, -1, false, 0);
      s << " " << decision_test::tiles_text(bp, -1, [](int) { return std::tuple<int, int, int>{}; });
    }
  }
  return s.str();
}

}  // namespace

int main() {
  for (const decision_test::Case& c : decision_test::cases()) {
    std::string line;
    try {
      line = decide(c);
    } catch (const Error& e) {
      line = "error";
    }
    std::cout << decision_test::name(c) << " => " << line << "\n";
  }
}
