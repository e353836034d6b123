// plan/gpu/launch.cpp — the GPU launch decision (launch.hpp): the forced kernel as a filter, the row of a tile plan,
// the band kernel's running-max steps and split, the parts of a compound split, the backward's row.
#include "plan/gpu/launch.hpp"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "plan/gpu/tiles.hpp"
#include "plan/key_plan.hpp"

namespace spattn::plan {

namespace {
// Whether the fused GPU kernels take the problem (else *why says what they do not take).
bool fused_gpu_takes(const Problem& pr, std::string* why) {
  if (pr.dtype != DType::bf16 && pr.dtype != DType::f16) {
    *why = "dtype " + std::string(dtype_name(pr.dtype)) + " (the fused GPU kernels take bf16 and fp16)";
    return false;
  }
  bool dim = false;
  for (const auto& k : kKernels) dim = dim || (k.engine == Engine::cuda_fused && k.head_dim == pr.head_dim);
  if (!dim) {
    *why = "head dim " + std::to_string(pr.head_dim) + " (the fused GPU kernels take 64 and 128)";
    return false;
  }
  if (pr.dv() != pr.head_dim) {
    *why = "value dim " + std::to_string(pr.dv()) + " != head dim " + std::to_string(pr.head_dim);
    return false;
  }
  return true;
}
}  // namespace

Engine choose_engine(const Problem& problem, const Device& device, Engine e, std::string* why) {
  const bool cuda = device.kind == Device::Kind::cuda;
  if (e == Engine::automatic) {
    if (!cuda) {
      *why = "CPU device";
      return Engine::cpu_fused;
    }
    if (std::string no; !fused_gpu_takes(problem, &no)) {
      *why = "the fused GPU kernels do not take " + no;
      return Engine::cuda_unfused;
    }
    *why = "the fused GPU kernels take this problem";
    return Engine::cuda_fused;
  }
  *why = "asked for";
  if ((e == Engine::cpu_fused || e == Engine::reference) && cuda)
    throw Error("engine " + std::string(engine_name(e)) + " runs on the CPU, device is " + device.str());
  if ((e == Engine::cuda_fused || e == Engine::cuda_unfused) && !cuda)
    throw Error("engine " + std::string(engine_name(e)) + " needs a CUDA device, device is cpu");
  if (std::string no; e == Engine::cuda_fused && !fused_gpu_takes(problem, &no))
    throw Error("engine cuda_fused does not take " + no);
  return e;
}

FusedOptions fused_options(const PlanOptions& o, KernelFilter* filter) {
  FusedOptions f;
  f.block_m = o.block_m;
  f.block_n = o.block_n;
  f.perm_d = o.perm_d;
  f.tile_map = o.tile_map;
  f.persistent = o.persistent;
  f.split = o.split;
  *filter = KernelFilter{};
  if (o.kernel.empty()) return f;
  filter->name = o.kernel;
  KernelKind kind{};
  const int row = find_kernel(o.kernel.c_str());
  if (row >= 0) {
    kind = kKernels[row].kind;
    if (!is_band(kind) && !o.block_m) f.block_m = kKernels[row].block_m, f.block_n = kKernels[row].block_n;
    filter->row = row;
  } else {
    bool found = false;
    for (KernelKind k : {KernelKind::sm80_mma, KernelKind::sm90_cp, KernelKind::sm90_tma, KernelKind::sm90_band,
                         KernelKind::sm90_band_rmax})
      if (o.kernel == kind_name(k)) kind = k, found = true;
    if (!found) throw Error("kernel '" + o.kernel + "' is not a fused GPU kernel: give a kind (sm80, sm90_cp, sm90_tma, " +
                            "sm90_band, sm90_band_rmax) or a kernel's name such as sm90_tma_128x128_d64");
  }
  if (!is_gpu_fused(kind)) throw Error("kernel '" + o.kernel + "' is not a fused GPU kernel");
  filter->kind = int(kind);
  f.force_sm80 = kind == KernelKind::sm80_mma;
  f.tma = kind != KernelKind::sm90_cp;
  if (kind == KernelKind::sm90_tma || is_band(kind)) f.tile_map = 0;  // they load affine rows (no tile map)
  f.band = is_band(kind) ? 1 : 0;
  f.running_max = kind == KernelKind::sm90_band_rmax ? 1 : 0;
  return f;
}

namespace {

// Chunks of the band kernel's slab c of query tile qt (items of block_m / 64 slabs, BandTraits): 0 where the slab is
// empty. A key prefix's chunks first, then the band's past them.
int slab_chunks(const BlockPlan& hp, int64_t qt, int c) {
  const int64_t qs = qt * hp.block_m + 64 * c, qe = std::min(qs + 63, hp.q_len - 1);
  if (qs >= hp.q_len) return 0;
  const int64_t pc = hp.band_prefix_chunks();
  const int64_t a = std::max(hp.band_first(qs), 64 * pc), z = hp.band_last(qe);
  return int(pc + (a <= z ? z / 64 - a / 64 + 1 : 0));
}

// The band kernel's chunks and non-empty slabs over the plan (their ratio kRunningMaxChunks or more: its running-max
// steps are chosen).
struct SlabChunks {
  int64_t chunks = 0, slabs = 0;
  bool long_rows() const { return slabs > 0 && chunks >= kRunningMaxChunks * slabs; }
  std::string average() const {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f", slabs > 0 ? double(chunks) / double(slabs) : 0.0);
    return b;
  }
};
SlabChunks count_slab_chunks(const BlockPlan& hp) {
  SlabChunks s;
  for (int64_t qt = 0; qt < hp.q_tiles; ++qt)
    for (int c = 0; c < hp.block_m / 64; ++c) {
      const int n = slab_chunks(hp, qt, c);
      s.chunks += n;
      s.slabs += n > 0;
    }
  return s;
}

}  // namespace

int choose_kernel(const BlockPlan& hp, int64_t head_dim, int cc, const FusedOptions& o, std::string* why) {
  std::string own;
  std::string& w = why ? *why : own;
  const int d = int(head_dim);
  if (o.force_sm80 || cc != 90) {
    w = o.force_sm80 ? "the mma.sync rows forced"
                     : "the mma.sync rows: compute capability " + std::to_string(cc / 10) + "." + std::to_string(cc % 10) +
                           " (the sm_90a rows need 9.0)";
    return find_kernel(KernelKind::sm80_mma, hp.block_m, hp.block_n, d);
  }
  if (o.tma && hp.perm_d == 1 && !hp.mapped()) {  // the TMA and band kernels load affine rows by tensor maps
    if (band_kernel_runs(hp, head_dim, o.band)) {
      // (A key prefix runs on the plain steps only: launch.cuh has no running-max instantiation with it.) Head dim
      // 128 has no running-max row: its long rows run on the TMA kernel, unless the band kernel is forced (then on
      // its plain steps). H100, L=16384, D=128: causal 0.91x on the band kernel's plain steps.
      const SlabChunks sc = hp.band_prefix == 0 && o.running_max < 0 ? count_slab_chunks(hp) : SlabChunks{};
      const bool rmax = hp.band_prefix == 0 && (o.running_max >= 0 ? o.running_max == 1 : sc.long_rows());
      int row = rmax ? find_kernel(KernelKind::sm90_band_rmax, hp.block_m, hp.block_n, d) : -1;
      if (row < 0 && (!rmax || o.band == 1)) row = find_kernel(KernelKind::sm90_band, hp.block_m, hp.block_n, d);
      const std::string steps = "slabs average " + sc.average() + " 64-key chunks, running max from " +
                                std::to_string(kRunningMaxChunks);
      if (row >= 0) {
        w = std::string("band rows on the band kernel (") + (o.band == 1 ? "forced" : "chosen: rows not dense") + "), " +
            (hp.band_prefix > 0     ? std::string("plain steps (a key prefix)")
             : o.running_max >= 0   ? std::string(rmax ? "running-max" : "plain") + " steps forced"
                                    : std::string(rmax ? "running-max" : "plain") + " steps (" + steps + ")");
        if (rmax && kKernels[row].kind == KernelKind::sm90_band)
          w += "; head dim " + std::to_string(d) + " has no running-max row: plain steps";
        return row;
      }
      w = "the TMA kernel: band rows with long slabs (" + steps + "; head dim " + std::to_string(d) +
          " has no running-max band row)";
    } else {
      w = band_kernel_applies(hp, head_dim)
              ? (o.band == 0 ? "the TMA kernel: the band kernel not allowed"
                             : "the TMA kernel: band rows keeping every key (the band kernel measured 2-3% slower)")
              : "the TMA kernel: unpermuted, unmapped rows (loaded by tensor maps)";
    }
    const int row = find_kernel(KernelKind::sm90_tma, hp.block_m, hp.block_n, d);
    if (row >= 0) return row;
  }
  w = !o.tma            ? "cp.async loads: the TMA rows not allowed"
      : hp.perm_d != 1  ? "cp.async loads: residue permutation " + std::to_string(hp.perm_d) + " (rows gathered)"
      : hp.mapped()     ? std::string("cp.async loads: a tile map (rows gathered)")
                        : "cp.async loads: the tile shape chosen, " + std::to_string(hp.block_m) + "x" +
                              std::to_string(hp.block_n) + ", has no TMA row";
  return find_kernel(KernelKind::sm90_cp, hp.block_m, hp.block_n, d);
}

SplitChoice choose_split(const BlockPlan& hp, int64_t bh, int sms, int split, int cap) {
  const int64_t n = hp.q_tiles * bh;  // work items, drawn in order: query tile order[w / bh], head w % bh
  SplitChoice k{int(n), 1, 0};
  if (split == 0 || n == 0) return k;
  const int nslab = hp.block_m / 64;  // slabs an item
  auto slab_split = [&](int64_t first) {  // items first... as their slabs (no workspace)
    k.first = int(first);
    k.parts = nslab;
    k.slabs = 1;
    return k;
  };
  if (split == 1) return slab_split(std::max<int64_t>(0, n - sms));  // forced: the last items (up to an SM each)
  if (split == -1 && n > sms) {
    // Chosen: the last partial wave of r items as single slabs where those fit in one wave and are not the
    // cheap items of the list (drawn longest first): local(256) at L=4096, B=2, H=16 is 704 items on 132 SMs,
    // 5.33 waves, the last 44 (12 three-slab items, 32 one-slab tail tiles) 68 slabs. A lone slab runs at a
    // warpgroup's rate without the others' overlap, but the wave ends ~2/3 of an item earlier.
    const int64_t r = n % sms;
    if (r == 0) return k;
    int64_t slabs = 0;
    int last_cost = 0, max_cost = 0, multi = 0;
    auto cost = [&](int64_t qt, int* nslabs) {  // an item's time ~ its longest slab's chunks
      int c_max = 0, ns = 0;
      for (int c = 0; c < nslab; ++c) {
        const int ch = slab_chunks(hp, qt, c);
        c_max = std::max(c_max, ch);
        ns += ch > 0;
      }
      *nslabs = ns;
      return c_max;
    };
    for (int64_t qt = 0; qt < hp.q_tiles; ++qt) {
      int ns = 0;
      max_cost = std::max(max_cost, cost(qt, &ns));
    }
    for (int64_t w = n - r; w < n; ++w) {
      int ns = 0;
      const int c = cost(hp.order[size_t(w / bh)], &ns);
      slabs += ns;
      if (ns > 1) multi += 1, last_cost = std::max(last_cost, c);
    }
    if (multi > 0 && slabs <= sms && 2 * last_cost >= max_cost) return slab_split(n - r);
    return k;
  }
  if (cap == 0) return k;
  int parts = 0;
  int64_t first = n;
  if (split >= 2) {  // forced: the last items, as many as the workspace holds, in `split` parts each
    parts = std::min(split, 4);
    first = std::max<int64_t>(0, n - cap / parts);
  } else {
    // Chosen: only where the items are fewer than the SMs (one partial wave: small batches, few heads, long
    // rows), each split into sms / n parts (at most 4). Splitting the last wave of a longer list over the keys
    // does not pay: local(256) at L=4096, B=2, H=16 (704 items on 132 SMs) lost 6% with its last 44 items in 3
    // parts (H100, bench/LOG.md): a part pays an item's fill, drain and epilogue plus the workspace
    // round trip.
    if (n >= sms) return k;
    parts = int(std::min<int64_t>(4, sms / n));
    if (parts < 2) return k;
    first = 0;
  }
  first = std::max(first, n - cap / parts);  // at most `cap` parts (the workspace)
  if (first >= n) return k;
  k.first = int(first);
  k.parts = parts;
  return k;
}

int head_section(int64_t group_bytes, int64_t units, int group, int64_t l2_bytes, const ListShape& shape) {
  group = std::max(group, 1);
  int64_t n = -1;
  if (const char* e = std::getenv("SPATTN_HEAD_SECTION"))  // A/B only: 0 one section, n > 0 groups a section
    n = std::atoll(e) > 0 ? std::atoll(e) * group : 0;
  if (n < 0) {
    if (group_bytes <= 0 || l2_bytes <= 0 || shape.imbalance > 8 || shape.reach < 1.0 / 3) return 0;
    n = std::max<int64_t>(1, l2_bytes * 5 / 8 / group_bytes) * group;
  }
  return n <= 0 || n >= units ? 0 : int(n);
}

ListShape list_shape(const std::vector<int64_t>& offsets, const std::vector<TileEntry>& entries, int64_t other_tiles,
                     int groups) {
  ListShape s;
  s.groups = std::max(groups, 1);
  if (offsets.size() < 2 || offsets.back() <= offsets.front() || entries.empty() || other_tiles <= 0) return s;
  const double span = double(std::max<int64_t>(1, other_tiles / s.groups));  // a residue group's tiles
  int64_t most = 0, lists = 0;
  double reach = 0;
  for (size_t i = 1; i < offsets.size(); ++i) {
    const int64_t a = offsets[i - 1], b = offsets[i];
    most = std::max(most, b - a);
    if (b <= a) continue;
    int32_t lo = INT32_MAX, hi = INT32_MIN;
    for (int64_t j = a; j < b; ++j) lo = std::min(lo, entries[size_t(j)].kt), hi = std::max(hi, entries[size_t(j)].kt);
    reach += std::min(1.0, double(int64_t(hi) - lo + 1) / span);
    ++lists;
  }
  s.imbalance = double(most) / (double(offsets.back() - offsets.front()) / double(offsets.size() - 1));
  s.reach = reach / double(lists);
  return s;
}

SplitChoice LaunchDecision::split_for(int64_t bh, int sms, int cap) const {
  return choose_split(tiles, bh, sms, split, cap);
}

LaunchDecision decide_tiles(const BoundPattern& pattern, const Analysis* analysis, int64_t head_dim,
                            const GpuTarget& target, const FusedOptions& o, const KernelFilter& filter) {
  LaunchDecision out;
  const Analysis own = analysis ? Analysis{} : analyze(pattern);
  const Analysis& an = analysis ? *analysis : own;
  out.analysis_ms = analysis ? 0.0 : own.ms;
  // The TMA rows of the kernel table (and their 192-row tiles) exist on compute capability 9.0 (sm_90a). A forced
  // kind the candidates are priced by (sm90_tma, sm90_cp) filters them (choose_block_plan's only_kind), where no tile
  // height is given (a forced row gives its shape).
  const bool tma = target.sm90a() && o.tma && !o.force_sm80;
  const bool kind_of_candidates = filter.kind == int(KernelKind::sm90_tma) || filter.kind == int(KernelKind::sm90_cp);
  const int only_kind = kind_of_candidates && o.block_m <= 0 ? filter.kind : -1;
  out.tiles = choose_block_plan(pattern, an, head_dim, o.block_m, o.block_n, o.perm_d, tma, o.tile_map,
                                o.device_draw != 0, only_kind);
  out.kernel_row = choose_kernel(out.tiles, head_dim, target.cc, o, &out.why);
  if (!filter.name.empty()) out.why = "kernel '" + filter.name + "' asked for; " + out.why;
  // Persistent TMA CTAs (one per SM, drawing items): measured faster than one item a CTA on every suite case
  // at D=64 and 128 (bench/LOG.md, v9).
  out.persistent = o.persistent >= 0 ? o.persistent : 1;
  out.split = o.split;
  if (out.kernel_row >= 0) {
    const KernelKind kind = kKernels[out.kernel_row].kind;
    out.running_max = kind == KernelKind::sm90_band_rmax;
    if (kind == KernelKind::sm90_tma || is_band(kind))
      out.why += out.persistent ? "; persistent CTAs (one an SM)" : "; one work item a CTA (forced)";
    if (is_band(kind))
      out.why += o.split == -1 ? "; split chosen per launch (fewer items than SMs: parts over keys; a short last wave: slabs)"
                               : "; split " + std::to_string(o.split) + " forced";
  }
  return out;
}

SplitTarget split_target(int64_t head_dim, const GpuTarget& target, const FusedOptions& f) {
  // Whether a tiles part of band rows runs on the band kernel (choose_kernel; choose_block_plan's band plans): the
  // compound split's rule for dense rows beside band rows.
  SplitTarget t;
  t.band_kernel = band_block_m(head_dim) > 0 && target.sm90a() && f.tma && !f.force_sm80 && f.band != 0 &&
                  f.block_m <= 0 && f.perm_d <= 1 && f.tile_map < 1;
  t.device_draw = f.device_draw != 0;
  // The affine part (issue 42) where nothing forces one tile plan.
  t.affine = f.block_m <= 0 && f.perm_d < 1 && f.tile_map < 1;
  t.head_dim = head_dim;
  t.tma = target.sm90a() && f.tma && !f.force_sm80;
  return t;
}

PatternDecision decide_pattern(const BoundPattern& pattern, const Analysis& analysis, int64_t head_dim,
                               const GpuTarget& target, const PlanOptions& o) {
  KernelFilter filter;
  const FusedOptions f = fused_options(o, &filter);
  PatternDecision out;
  // A forced kernel runs the pattern as one tile list.
  out.split = split_pattern(pattern, analysis, o.kernel.empty() ? o.compound : 0, split_target(head_dim, target, f));
  if (!out.compound()) {
    LaunchDecision d = decide_tiles(pattern, &analysis, head_dim, target, f, filter);
    if (!filter.admits(d.kernel_row))
      throw Error("kernel '" + o.kernel + "' cannot run pattern '" + pattern.spec() + "' at head dim " +
                  std::to_string(head_dim) + " on this device: the planner's choice is " +
                  (d.kernel_row >= 0 ? kKernels[d.kernel_row].name : "none") + " (" + d.why + "; " + d.tiles.describe() + ")");
    out.launches.push_back(std::move(d));
    return out;
  }
  // Parts other than the tiles take the planner's choices (a forced kernel is for the tiles).
  FusedOptions sub;
  sub.force_sm80 = f.force_sm80;
  for (const Part& p : out.split.parts) {
    switch (p.kind) {
      case PartKind::tiles:
        out.launches.push_back(decide_tiles(p.pattern, p.analysis ? &*p.analysis : nullptr, head_dim, target, f));
        break;
      case PartKind::rows: {
        // Dense rows against every key: few work items (one query tile a head), so the band kernel where it
        // applies (head dim 64 or 128, sm_90a), whose split over keys runs each item in up to 4 parts merged on chip
        // (FusedOptions::split); the chosen rule would leave dense rows to the TMA kernel, one CTA an item.
        FusedOptions rows = sub;
        rows.band = 1;
        out.launches.push_back(decide_tiles(p.pattern, nullptr, head_dim, target, rows));
        break;
      }
      case PartKind::columns:
        out.launches.push_back(decide_tiles(p.pattern, nullptr, head_dim, target, sub));
        break;
      case PartKind::affine:  // grouped by residue where the cost model says so (its analysis: residue d)
        out.launches.push_back(decide_tiles(p.pattern, p.analysis ? &*p.analysis : nullptr, head_dim, target, sub));
        break;
      case PartKind::scattered:
        out.launches.emplace_back();
        break;
    }
  }
  return out;
}

BackwardChoice backward_choice(const std::string& kernel, int64_t head_dim) {
  BackwardChoice c;
  c.kernel = kernel;
  c.csr = kernel == "cuda_csr_bwd";
  if (kernel == "sm90_bwd_strips") {
    std::string w;
    c.row = query_strips_row(head_dim, &w);
    if (c.row < 0) throw Error("backward kernel 'sm90_bwd_strips': " + w);
    c.query_strips = true;
    return c;
  }
  c.warp_specialized = kernel != kind_name(KernelKind::sm90_bwd);
  if (kernel.empty() || c.csr || !c.warp_specialized) return c;
  int row = find_kernel(kernel.c_str());
  if (kernel == kind_name(KernelKind::sm90_bwd_ws))  // the warp-specialized row of the head dim
    row = first_kernel(KernelKind::sm90_bwd_ws, int(head_dim));
  if (row < 0 || (!is_tile_bwd(kKernels[row].kind) && kKernels[row].kind != KernelKind::cuda_csr_bwd))
    throw Error("backward kernel '" + kernel + "' is not a GPU backward kernel of the kernel table (sm90_bwd, " +
                "sm90_bwd_ws or a row of them, cuda_csr_bwd)");
  if (bwd_strips_only(kKernels[row]))
    throw Error("backward kernel '" + kernel + "' runs query strips only (backward_kernel 'sm90_bwd_strips')");
  if (kKernels[row].head_dim && kKernels[row].head_dim != head_dim)
    throw Error("backward kernel '" + kernel + "' runs head dim " + std::to_string(kKernels[row].head_dim) +
                ", the problem has " + std::to_string(head_dim));
  if (is_tile_bwd(kKernels[row].kind)) c.row = row;
  return c;
}

QueryStripsGrid query_strips_grid(const BoundPattern& pattern) {
  const std::optional<NeighborhoodGrid> grid = pattern.neighborhood_grid();
  if (!grid) return QueryStripsGrid::none;
  int long_axes = 0;
  for (int a = 0; a < grid->naxes; ++a) long_axes += grid->dims[size_t(a)] > 1;
  return long_axes == 2 ? QueryStripsGrid::two_d : QueryStripsGrid::other;
}

bool query_strips_asked(const BackwardChoice& c, QueryStripsGrid grid) {
  if (c.query_strips) return true;
  if (!c.kernel.empty()) return false;  // another kernel forced
  return grid == QueryStripsGrid::two_d;
}

int query_strips_row(int64_t head_dim, std::string* why) {
  const int row = find_kernel(KernelKind::sm90_bwd, 64, 64, int(head_dim));
  if (row < 0 && why) *why = "query strips need a 64x64 sm90_bwd row at head dim " + std::to_string(head_dim) + ", the table has none";
  return row;
}

int backward_row(const BackwardChoice& c, const Analysis& analysis, int64_t head_dim) {
  return c.row >= 0 ? c.row : choose_backward_row(analysis, head_dim, c.warp_specialized);
}

namespace {
// The backward's residue groups (issue 42): groups of at most half a key tile of tokens leave most of each of the
// backward's tiles padding, and its items are key tiles, one a CTA (sparse_strided(512)'s affine part at L = 16384:
// 512 groups of 32 tokens, a 64x64 tile each at D = 64, 12% kept; 64x128 at D = 128, 6% kept). d / 2^j for the least
// j whose groups hold more than half a key tile puts 2^j residues in a group (a row's keys stay in its group: d / 2^j
// divides d), in bitmask tiles: at D = 64, 256 groups of 64 tokens (256 tiles a head, 24% kept); at D = 128, 128
// groups of 128 (128 key tiles of two query tiles each, 13% kept). 0 where none applies.
int backward_groups(int d, int64_t len, int block_n) {
  if (d < 2 || gpu::ceil_div(len, d) > block_n / 2) return 0;
  for (int c = d; c % 2 == 0;) {
    c /= 2;
    if (gpu::ceil_div(len, c) > block_n / 2) return c > 1 ? c : 0;
  }
  return 0;
}
}  // namespace

BlockPlan backward_tiles(const BoundPattern& pattern, const Analysis& analysis, int64_t head_dim, int row) {
  // No tile map (plan/tile_map.hpp): the backward kernel gathers rows by identity or residue groups only (any
  // stride, kMaxGpuPermutation, as the forward), coarser where the forward's groups are short (backward_groups:
  // backward 1.01-1.74x on issue 42's strided cases, measured in one process against the forward's groups).
  const int bn = kKernels[row].block_n;
  BlockPlan p = choose_block_plan(pattern, analysis, head_dim, 64, bn, -1, false, 0);
  if (p.perm_d > 1)
    if (const int c = backward_groups(p.perm_d, std::min(p.q_len, p.k_len), bn); c > 1)
      return choose_block_plan(pattern, analysis, head_dim, 64, bn, c, false, 0);
  return p;
}

std::string BackwardParts::describe() const {
  std::ostringstream s;
  if (!by_parts()) return "backward: the whole pattern (" + why + ")";
  s << "backward by parts (" << why << "), the first part writes dQ, dK, dV and the others add to them:";
  for (size_t i = 0; i < parts.size(); ++i) {
    const BackwardPart& p = parts[i];
    s << "\n    " << part_kind_name(p.kind) << " [" << p.terms << "]: " << p.nnz << " kept scores; ";
    if (p.kind == PartKind::tiles || p.kind == PartKind::affine)
      s << "the tile backward (its own tile plan" << (p.kind == PartKind::affine ? ", grouped by residue" : "")
        << (i > 0 ? "; dQ, dK, dV added)" : ")");
    else if (p.kind == PartKind::columns && i > 0)
      s << "the tile backward over its " << p.columns.size() << " keys gathered (dK, dV added to theirs)";
    else
      s << "the CSR pass over the part's CSR and its transpose (cuda_scattered_bwd: a row and a key an eight-lane "
           "group, 16-byte gathers; cuda_csr_bwd where it cannot run the tensors)";
  }
  return s.str();
}

void backward_part_csr(const BackwardPart& p, std::vector<int64_t>& offsets, std::vector<int32_t>& cols) {
  if (p.kind == PartKind::scattered) {
    offsets = p.offsets;
    cols = p.cols;
    return;
  }
  const int64_t lq = p.pattern.q_len();
  offsets.assign(size_t(lq) + 1, 0);
  cols.clear();
  RowRuns runs;
  for (int64_t q = 0; q < lq; ++q) {
    p.pattern.row(q, runs);
    for (const Run& r : runs)
      for (int64_t i = 0; i < r.count; ++i) {
        const int64_t k = r.start + i * r.stride;
        cols.push_back(p.kind == PartKind::columns ? p.columns[size_t(k)] : int32_t(k));
      }
    offsets[size_t(q) + 1] = int64_t(cols.size());
  }
}

BackwardParts backward_parts(const BoundPattern& pattern, const Analysis& analysis, int64_t head_dim,
                             const GpuTarget& target, const PlanOptions& o) {
  BackwardParts out;
  if (!o.kernel.empty() || !o.backward_kernel.empty()) {
    out.why = "a kernel forced";
    return out;
  }
  KernelFilter filter;
  const FusedOptions f = fused_options(o, &filter);
  SplitTarget st = split_target(head_dim, target, f);
  st.device_draw = false;  // the scattered part's CSR on the host: its transpose is built from it
  Split split = split_pattern(pattern, analysis, o.compound, st);
  if (!split.compound()) {
    out.why = "one tile list";
    return out;
  }
  for (const Part& p : split.parts)
    if (p.kind == PartKind::rows) {
      out.why = "a rows part replaces its rows' output";
      return out;
    }
  for (Part& p : split.parts) {
    BackwardPart b;
    b.kind = p.kind;
    b.terms = p.terms;
    b.nnz = p.nnz;
    switch (p.kind) {
      case PartKind::tiles:
      case PartKind::affine:  // its own tile plan, grouped by residue (the forward's)
        b.pattern = std::move(p.pattern);
        b.analysis = std::move(p.analysis);
        break;
      case PartKind::columns:
        b.pattern = std::move(p.pattern);
        b.columns = std::move(p.columns);
        break;
      case PartKind::scattered:
        b.offsets = std::move(p.offsets);
        b.cols = std::move(p.cols);
        break;
      case PartKind::rows: break;
    }
    out.parts.push_back(std::move(b));
  }
  out.why = "compound split of " + std::to_string(out.parts.size()) + " parts";
  return out;
}

}  // namespace spattn::plan
