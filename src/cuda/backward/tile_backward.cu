// cuda/backward/tile_backward.cu — see tile_backward.hpp; the kernels are in tile_bwd.cuh.
#include "cuda/backward/tile_backward.hpp"

#include <algorithm>
#include <atomic>
#include <optional>
#include <sstream>
#include <string>

#include "cuda/backward/tile_bwd_ws2.cuh"
#include "cuda/common/check.hpp"
#include "cuda/common/device.hpp"
#include "cuda/common/launch.cuh"  // raise_smem_limit
#include "cuda/common/tmap.hpp"
#include "plan/gpu/launch.hpp"
#include "plan/kernels.hpp"
#include "plan/key_plan.hpp"

namespace spattn::cuda {

namespace {
std::atomic<int> g_dq_owner_mode{1};  // TileBackward::set_dq_owner_mode
}  // namespace

TileBackward::TileBackward(const BoundPattern& pattern, const plan::Analysis& an, const Problem& problem, int row,
                           bool query_strips)
    : problem_(problem), row_(row), strips_(query_strips) {
  if (row < 0 || !plan::is_tile_bwd(plan::kKernels[row].kind) || plan::kKernels[row].head_dim != problem.head_dim)
    throw Error("backward tiles: no sm90_bwd row for head dim " + std::to_string(problem.head_dim));
  plan::KeyMajorPlan km;
  int64_t q_tiles = 0;
  if (query_strips) {
    if (plan::kKernels[row].kind != plan::KernelKind::sm90_bwd || plan::kKernels[row].block_n != 64)
      throw Error(std::string("backward query strips: need a 64x64 sm90_bwd row, got ") + plan::kKernels[row].name);
    std::string why;
    std::optional<plan::KeyMajorPlan> s = plan::key_major_strips(pattern, &why);
    if (!s) throw Error("backward " + why);
    if (problem.q_len >= int64_t(INT32_MAX) - 64 || problem.kv_len >= int64_t(INT32_MAX))
      throw Error("backward query strips: lengths below 2^31 - 64");
    km = std::move(*s);
    std::ostringstream d;
    d << "query strips over " << km.key_boxes << ": " << km.k_tiles << " key boxes, " << km.q_tiles << " strips, "
      << km.entries.size() << " entries (all bitmasks), kept " << km.kept_fraction() << " of visited scores";
    strips_desc_ = d.str();
    strip_k_tiles_ = km.k_tiles;
    strip_sx_ = km.strip_sx, strip_sy_ = km.strip_sy;
    k_map_ = DeviceBuffer::upload(km.k_map);
    q_tiles = (problem.q_len + 63) / 64;  // lse2, delta, dq_acc in token order
  } else {
    plan_ = plan::backward_tiles(pattern, an, problem.head_dim, row);
    if (plan_.mapped()) throw Error("backward tiles: a mapped plan (tile map) is not supported");
    km = plan::key_major(plan_);
    q_tiles = plan_.q_tiles;
  }
  nbitmask_ = int64_t(km.masks.size()) / km.block_n;
  col_offsets_ = DeviceBuffer::upload(km.col_offsets);
  entries_ = DeviceBuffer::upload(km.entries);
  masks_ = DeviceBuffer::upload(km.masks);
  order_ = DeviceBuffer::upload(km.order);
  shape_ = plan::list_shape(km.col_offsets, km.entries, km.q_tiles, plan::section_groups(true, plan_.perm_d));
  const int64_t rows = problem.batch * problem.q_heads * q_tiles * 64;
  dq_acc_ = DeviceBuffer(size_t(checked_bytes("backward dQ accumulator", {rows, problem.head_dim}, 4)));
  work_counter_ = DeviceBuffer(sizeof(int));
  // dQ owners (launch(): the D = 128 warp-specialized row only, so other rows build none)
  const bool ws128 = problem.head_dim == 128 && plan::kKernels[row].kind == plan::KernelKind::sm90_bwd_ws;
  if (const std::vector<int32_t> owner =
          ws128 ? plan::dq_owners(km, &dq_rev_, g_dq_owner_mode.load() == 2) : std::vector<int32_t>{};
      !owner.empty()) {
    dq_owner_ = DeviceBuffer::upload(owner);
    dq_ready_ = DeviceBuffer(size_t(problem.batch * problem.q_heads * q_tiles) * sizeof(int));
  }
  lse2_ = DeviceBuffer(size_t(rows) * 4);
  delta_ = DeviceBuffer(size_t(rows) * 4);
}

std::string TileBackward::refusal(const Problem& p, const TensorView& q, const TensorView& k, const TensorView& v,
                                  const TensorView& o, const TensorView& lse, const TensorView& dout,
                                  const TensorView& dq, const TensorView& dk, const TensorView& dv) {
  DeviceInfo info;
  try {
    info = device_info(current_device());
  } catch (const Error& e) {
    return e.what();
  }
  if (!info.sm90a()) return "needs an sm_90a device (compute capability 9.0), device has " + std::to_string(info.cc);
  if (q.dtype != DType::bf16 && q.dtype != DType::f16)
    return "needs bf16 or fp16 tensors, q has " + std::string(dtype_name(q.dtype));
  if ((p.head_dim != 64 && p.head_dim != 128) || p.dv() != p.head_dim)
    return "head dim 64 or 128 (v's equal), got " + std::to_string(p.head_dim) + " / " + std::to_string(p.dv());
  if (p.q_len >= (int64_t(1) << 30) || p.kv_len >= (int64_t(1) << 30)) return "lengths below 2^30";
  const TensorView* all[] = {&q, &k, &v, &dout, &o, &dq, &dk, &dv};
  const char* names[] = {"q", "k", "v", "dout", "o", "dq", "dk", "dv"};
  for (int i = 0; i < 8; ++i) {
    const TensorView& t = *all[i];
    if (t.dtype != q.dtype) return std::string(names[i]) + " has dtype " + std::string(dtype_name(t.dtype)) + ", q " + std::string(dtype_name(q.dtype));
    if (t.stride[3] != 1) return std::string(names[i]) + " needs a contiguous head dim";
    const int64_t align = i < 4 ? 8 : 2;  // elements: 16-byte cp.async rows; 4-byte loads and stores
    if (reinterpret_cast<uintptr_t>(t.data) % (2 * align) || t.stride[0] % align || t.stride[1] % align ||
        t.stride[2] % align)
      return std::string(names[i]) + " must be " + std::to_string(2 * align) + "-byte aligned, pointer and strides";
  }
  if (!lse.data || lse.dtype != DType::f32 || lse.stride[2] != 1)
    return "needs the forward's lse, fp32, contiguous along the queries";
  return "";
}

int TileBackward::kernel_row() const { return ran_row_ >= 0 ? ran_row_ : row_; }

std::string TileBackward::explain() const {
  std::ostringstream s;
  if (strips_) {
    s << "backward " << plan::kKernels[row_].name << ": key-major " << strips_desc_;
    return s.str();
  }
  s << "backward " << plan::kKernels[row_].name << ": key-major " << plan_.describe() << " ("
    << nbitmask_ << " transposed bitmasks)";
  return s.str();
}

namespace {
std::atomic<int64_t> g_prepfin[3];  // PrepFinCounts' fields, in order
std::atomic<int64_t> g_smem_epi{0};  // TileBackward::smem_epilogue_launches
std::atomic<int64_t> g_fin_tile[2];  // FinishTileCounts' fields, in order
std::atomic<int64_t> g_dq_owner{0};  // TileBackward::dq_owner_launches

// Rows of a [B, L, H, D] view of 2-byte elements start 16-byte aligned: its pointer, and its strides in 8 elements.
bool rows_16byte(const void* data, int64_t sb, int64_t sl, int64_t sh) {
  return reinterpret_cast<uintptr_t>(data) % 16 == 0 && sb % 8 == 0 && sl % 8 == 0 && sh % 8 == 0;
}

std::atomic<int> g_grid_limit{65535};  // TileBackward::set_prepfin_grid_limit
std::atomic<int64_t> g_persist{0};     // TileBackward::persistent_launches
std::atomic<int> g_persist_grid{0};    // TileBackward::last_persistent_grid
std::atomic<int> g_persist_limit{0};   // TileBackward::set_persistent_grid_limit (0: the SMs')

// f(c, grid) for the prep / finish grids (bwd_prep_grid_kernel and bwd_finish_grid_kernel, kPfRows<D> rows a CTA;
// bwd_finish_tile_kernel, 64) of p's batches and query heads, cta_rows plan-space rows a CTA (grid x), in chunks of at
// most g_grid_limit of each (grid y and z): c is p with its pointers to O, dO, dQ, lse and the plan-space rows moved to
// the chunk's first batch and head (the kernels' row index keeps p.q_heads as its stride).
template <class Elem, int D, class F>
void prepfin_grids(const bwd::BwdParams& p, int cta_rows, F&& f) {
  const int lim = g_grid_limit.load();
  for (int b0 = 0; b0 < p.batch; b0 += lim)
    for (int h0 = 0; h0 < p.q_heads; h0 += lim) {
      bwd::BwdParams c = p;
      const auto at = [&](const void* t, int64_t sb, int64_t sh) {
        return static_cast<const Elem*>(t) + (b0 * sb + h0 * sh);
      };
      c.o = at(p.o, p.o_sb, p.o_sh), c.dout = at(p.dout, p.do_sb, p.do_sh);
      c.dq = const_cast<Elem*>(at(p.dq, p.dq_sb, p.dq_sh));
      c.lse = p.lse + (b0 * p.lse_sb + h0 * p.lse_sh);
      const int64_t r0 = (int64_t(b0) * p.q_heads + h0) * p.qp;
      c.dq_acc = p.dq_acc + r0 * D, c.lse2 = p.lse2 + r0, c.delta = p.delta + r0;
      if (p.dq_ready) c.dq_ready = p.dq_ready + r0 / 64;
      f(c, dim3(unsigned(p.qp / cta_rows), unsigned(std::min(lim, p.q_heads - h0)),
                unsigned(std::min(lim, p.batch - b0))));
    }
}

// Prep, the tile kernel (Tr::kThreads a CTA, a CTA per key tile, batch and kv head), finish (kWs: a
// warp-specialized kernel's accumulator order, its warpgroups' dQ columns, by bwd_finish_tile_kernel; 0: row-major,
// by bwd_finish_grid_kernel). Prep and finish: grids of (plan-space rows, head, batch) (prepfin_grids), 16-byte O
// loads and dq stores where those rows are 16-byte aligned.
// grid: the tile kernel's CTAs (0: one per key tile, batch and kv head; a persistent kernel loops over those items).
template <class Tr, int kWs>
void launch_three(void (*kernel)(bwd::BwdParams), const bwd::BwdParams& p, cudaStream_t s, int64_t grid = 0) {
  using Elem = typename Tr::Elem;
  constexpr int D = Tr::D;
  constexpr bool B16 = Tr::kBf16;
  constexpr int NT = bwd::kPfThreads;
  SPATTN_CUDA_CHECK(raise_smem_limit(reinterpret_cast<const void*>(kernel), Tr::kSmemBytes));
  if (p.qp % 64 != 0)
    throw Error("backward: plan-space query rows " + std::to_string(p.qp) + " not whole 64-row tiles");
  const int64_t rows = int64_t(p.batch) * p.q_heads * p.qp;  // none: the tile kernel alone (dK, dV)
  const bool o16 = rows_16byte(p.o, p.o_sb, p.o_sl, p.o_sh);
  const bool dq16 = rows_16byte(p.dq, p.dq_sb, p.dq_sl, p.dq_sh);
  ++g_prepfin[0], g_prepfin[1] += o16, g_prepfin[2] += dq16;
  if (rows > 0) {
    prepfin_grids<Elem, D>(p, bwd::kPfRows<D>, [&](const bwd::BwdParams& c, dim3 grid) {
      if (o16)
        bwd::bwd_prep_grid_kernel<Elem, B16, D, true><<<grid, NT, 0, s>>>(c);
      else
        bwd::bwd_prep_grid_kernel<Elem, B16, D, false><<<grid, NT, 0, s>>>(c);
    });
    SPATTN_LAUNCH_CHECK("backward prep");
  }
  // dQ owners' waits go to items taken earlier from the counter: the persistent grid only (tile_bwd_ws2.cuh, Ws2Items)
  if (p.dq_owner && grid <= 0) throw Error("backward: dQ owners on a grid of a CTA an item (the persistent grid only)");
  int64_t ctas = int64_t(p.k_tiles) * p.batch * p.kv_heads;
  if (grid > 0) ctas = std::min(ctas, grid);
  if (ctas > 0) kernel<<<unsigned(ctas), Tr::kThreads, Tr::kSmemBytes, s>>>(p);
  SPATTN_LAUNCH_CHECK("backward tiles");
  if (rows == 0) return;
  if constexpr (kWs != 0) {
    constexpr int FT = bwd::kFinThreads;
    ++g_fin_tile[0], g_fin_tile[1] += p.dq_accumulate;
    prepfin_grids<Elem, D>(p, 64, [&](const bwd::BwdParams& c, dim3 grid) {
      if (dq16)
        bwd::bwd_finish_tile_kernel<Elem, B16, D, kWs, true><<<grid, FT, 0, s>>>(c);
      else
        bwd::bwd_finish_tile_kernel<Elem, B16, D, kWs, false><<<grid, FT, 0, s>>>(c);
    });
  } else {
    prepfin_grids<Elem, D>(p, bwd::kPfRows<D>, [&](const bwd::BwdParams& c, dim3 grid) {
      if (dq16)
        bwd::bwd_finish_grid_kernel<Elem, B16, D, true><<<grid, NT, 0, s>>>(c);
      else
        bwd::bwd_finish_grid_kernel<Elem, B16, D, false><<<grid, NT, 0, s>>>(c);
    });
  }
  SPATTN_LAUNCH_CHECK("backward finish");
}
// strips: query strips (BwdParams::k_map), 64-key rows only.
template <int BN, int D, bool kBf16>
void launch_tiles(const bwd::BwdParams& p, bool tma, bool strips, cudaStream_t s) {
  using Tr = bwd::BwdTraits<BN, D, kBf16>;
  if (strips) {
    if constexpr (BN == 64) return launch_three<Tr, 0>(bwd::tile_bwd_kernel<Tr, false, true>, p, s);
    throw Error("backward query strips: run on 64-key rows only");
  }
  if constexpr (BN == 64 && D == 128)  // plan::bwd_strips_only: its other instantiations would spill; none compiled
    throw Error("backward tiles: sm90_bwd_64x64_d128 runs query strips only");
  else
    launch_three<Tr, 0>(tma ? bwd::tile_bwd_kernel<Tr, true> : bwd::tile_bwd_kernel<Tr, false>, p, s);
}
// epi: the shared-memory dK / dV epilogue (bwd::SmemEpilogue); without it (dkv_accumulate, or dk / dv without
// tensor maps) each thread stores its pairs.
template <class Tr, int kWs>
void launch_ws_epi(const bwd::BwdParams& p, bool epi, cudaStream_t s) {
  if (epi) {
    ++g_smem_epi;
    launch_three<bwd::SmemEpilogue<Tr>, kWs>(bwd::tile_bwd_ws_kernel<bwd::SmemEpilogue<Tr>>, p, s);
  } else {
    launch_three<Tr, kWs>(bwd::tile_bwd_ws_kernel<Tr>, p, s);
  }
}
// The persistent grid of either row (with the shared-memory epilogue and an item counter; else a CTA an item): a CTA
// an SM (the kernel's shared memory holds one), at most the items, which the CTAs take from p.work_counter
// (tile_bwd_ws2.cuh, Ws2Items), zeroed here on the stream (a memset node where captured).
template <class Pt>
void launch_persistent(const bwd::BwdParams& p, cudaStream_t s) {
  static_assert(2 * Pt::kSmemBytes > 228 * 1024, "one CTA an SM (sm_90's 228 KB of shared memory)");
  const auto kernel = bwd::tile_bwd_ws_kernel<Pt>;
  SPATTN_CUDA_CHECK(raise_smem_limit(reinterpret_cast<const void*>(kernel), Pt::kSmemBytes));
  int64_t grid = device_info(current_device()).sms;
  if (const int lim = g_persist_limit.load(); lim > 0) grid = lim;
  grid = std::max<int64_t>(1, std::min(grid, int64_t(p.k_tiles) * p.batch * p.kv_heads));
  SPATTN_CUDA_CHECK(cudaMemsetAsync(p.work_counter, 0, sizeof(int), s));
  ++g_smem_epi, ++g_persist;
  g_persist_grid = int(grid);
  launch_three<Pt, Pt::kDQ>(kernel, p, s, grid);
}
// The D = 128 row; its persistent grid as the D = 64 row's (launch_ws2). Against a CTA a key tile (H200, bf16, one
// process, backward time): local(256) 0.956, neighborhood(kernel=257) 0.950, local(256) GQA 32/4 0.986, local(1024)
// 0.965, causal 0.972, local(left=4096) GQA 0.972, sinks GQA 0.963, block mask 0.949, dense 0.971 (bench/LOG.md).
template <int D, bool kBf16>
void launch_ws(const bwd::BwdParams& p, bool epi, cudaStream_t s) {
  using Tr = bwd::BwdWsTraits<D, kBf16>;
  if (epi && p.work_counter) return launch_persistent<bwd::Persistent<bwd::SmemEpilogue<Tr>>>(p, s);
  launch_ws_epi<Tr, D / 2>(p, epi, s);
}
template <bool kBf16>
void launch_ws2(const bwd::BwdParams& p, bool epi, cudaStream_t s) {
  using Tr = bwd::BwdWs2Traits<kBf16>;
  if (epi && p.work_counter) return launch_persistent<bwd::Persistent<bwd::SmemEpilogue<Tr>>>(p, s);
  launch_ws_epi<Tr, Tr::kDQ>(p, epi, s);
}

// The sm90_bwd and sm90_bwd_ws rows of the kernel table, each instantiated for bf16 and fp16; row `row` launched
// (a warp-specialized row needs `tma`; epi: its shared-memory epilogue).
template <int... I>
void launch_row(int row, bool bf16, bool tma, bool strips, bool epi, const bwd::BwdParams& p, cudaStream_t s,
                std::integer_sequence<int, I...>) {
  bool done = false;
  auto one = [&](auto ic) {
    constexpr plan::KernelConfig c = plan::kKernels[decltype(ic)::value];
    if constexpr (c.kind == plan::KernelKind::sm90_bwd) {
      if (decltype(ic)::value == row) {
        bf16 ? launch_tiles<c.block_n, c.head_dim, true>(p, tma, strips, s)
             : launch_tiles<c.block_n, c.head_dim, false>(p, tma, strips, s);
        done = true;
      }
    } else if constexpr (c.kind == plan::KernelKind::sm90_bwd_ws) {
      static_assert(c.block_m == (c.head_dim == 64 ? 128 : 64) && c.block_n == 128,
                    "tile_bwd_ws2.cuh: 128 queries a step (D = 64), tile_bwd_ws.cuh: 64 (D = 128); 128 keys a CTA");
      if (decltype(ic)::value == row && tma && !strips) {
        if constexpr (c.block_m == 128)
          bf16 ? launch_ws2<true>(p, epi, s) : launch_ws2<false>(p, epi, s);
        else
          bf16 ? launch_ws<c.head_dim, true>(p, epi, s) : launch_ws<c.head_dim, false>(p, epi, s);
        done = true;
      }
    }
  };
  (one(std::integral_constant<int, I>{}), ...);
  if (!done) throw Error("backward tiles: kernel-table row " + std::to_string(row) + " is not an sm90_bwd row");
}
}  // namespace

void TileBackward::run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                       const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                       const TensorView& dv, void* stream, bool dq_accumulate, bool dkv_accumulate) const {
  DeviceLists l;
  l.col_offsets = col_offsets_.get<int64_t>(), l.entries = entries_.get<int4>();
  l.masks = masks_.get<unsigned long long>(), l.order = order_.get<int32_t>();
  if (strips_) {  // token order: no permutation
    l.q_tiles = (problem_.q_len + 63) / 64, l.k_tiles = strip_k_tiles_;
    l.q_group = l.q_tiles * 64, l.k_group = l.k_tiles * 64;
    l.k_map = k_map_.get<int32_t>(), l.strip_sx = strip_sx_, l.strip_sy = strip_sy_;
  } else {
    l.q_tiles = plan_.q_tiles, l.k_tiles = plan_.k_tiles;
    l.perm_d = plan_.perm_d, l.q_group = plan_.q_group, l.k_group = plan_.k_group;
  }
  l.dq_acc = dq_acc_.get<float>(), l.lse2 = lse2_.get<float>(), l.delta = delta_.get<float>();
  l.shape = shape_;
  l.work_counter = work_counter_.get<int>();
  l.dq_owner = dq_owner_.get<int32_t>(), l.dq_ready = dq_ready_.get<int>(), l.dq_rev = dq_rev_;
  ran_row_ = launch(problem_, row_, l, q, k, v, o, lse, dout, dq, dk, dv, stream, &last_tma_, dq_accumulate,
                   dkv_accumulate);
}

int TileBackward::launch(const Problem& pr, int row, const DeviceLists& l, const TensorView& q, const TensorView& k,
                         const TensorView& v, const TensorView& o, const TensorView& lse, const TensorView& dout,
                         const TensorView& dq, const TensorView& dk, const TensorView& dv, void* stream, bool* tma_out,
                         bool dq_accumulate, bool dkv_accumulate) {
  bwd::BwdParams p{};
  p.q = q.data, p.k = k.data, p.v = v.data, p.o = o.data, p.dout = dout.data;
  p.dq = dq.data, p.dk = dk.data, p.dv = dv.data;
  p.q_sb = q.stride[0], p.q_sl = q.stride[1], p.q_sh = q.stride[2];
  p.k_sb = k.stride[0], p.k_sl = k.stride[1], p.k_sh = k.stride[2];
  p.v_sb = v.stride[0], p.v_sl = v.stride[1], p.v_sh = v.stride[2];
  p.o_sb = o.stride[0], p.o_sl = o.stride[1], p.o_sh = o.stride[2];
  p.do_sb = dout.stride[0], p.do_sl = dout.stride[1], p.do_sh = dout.stride[2];
  p.dq_sb = dq.stride[0], p.dq_sl = dq.stride[1], p.dq_sh = dq.stride[2];
  p.dk_sb = dk.stride[0], p.dk_sl = dk.stride[1], p.dk_sh = dk.stride[2];
  p.dv_sb = dv.stride[0], p.dv_sl = dv.stride[1], p.dv_sh = dv.stride[2];
  p.lse = static_cast<const float*>(lse.data);
  p.lse_sb = lse.stride[0], p.lse_sh = lse.stride[1];
  p.dq_acc = l.dq_acc, p.lse2 = l.lse2, p.delta = l.delta;
  p.batch = int(pr.batch), p.q_heads = int(pr.q_heads), p.kv_heads = int(pr.kv_heads);
  p.group = int(pr.q_heads / pr.kv_heads);
  p.q_len = int(pr.q_len), p.k_len = int(pr.kv_len), p.perm_d = l.perm_d;
  p.q_group = int(l.q_group), p.k_group = int(l.k_group);
  p.qp = int(l.q_tiles * 64), p.head_dim = int(pr.head_dim);
  p.scale = float(pr.softmax_scale());
  p.scale_log2 = float(pr.softmax_scale() * 1.4426950408889634);
  p.col_offsets = l.col_offsets, p.entries = static_cast<const int4*>(l.entries);
  p.masks = l.masks, p.order = l.order, p.work_counter = l.work_counter;
  p.k_tiles = int(l.k_tiles);
  p.dq_accumulate = dq_accumulate ? 1 : 0;
  p.dkv_accumulate = dkv_accumulate ? 1 : 0;
  p.k_map = l.k_map, p.strip_sx = l.strip_sx, p.strip_sy = l.strip_sy;
  // Head sections of the grid: what a kv head's CTAs share, its group's Q, dO (bf16 / fp16), dQ accumulator (fp32),
  // lse2 and delta.
  const int64_t esize = int64_t(dtype_size(pr.dtype));
  p.head_section = plan::head_section(
      int64_t(p.group) * p.qp * ((pr.head_dim + pr.dv()) * esize + 4 * pr.head_dim + 8),
      pr.batch * pr.kv_heads, 1, device_info(current_device()).l2_bytes, l.shape);
  const bool strips = l.k_map != nullptr;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  // TMA loads where the plan is the identity and the driver gives q and dout tensor maps (else cp.async; query strips
  // gather their rows).
  const bool tma = !strips && l.perm_d == 1 && encode_tmap(p.tmap_q, q, 64) && encode_tmap(p.tmap_do, dout, 64);
  if (tma_out) *tma_out = tma;
  // A warp-specialized row loads by TMA only: without it, the 64x128 row of the head dim runs (and is reported).
  int ran = row;
  if (plan::kKernels[row].kind == plan::KernelKind::sm90_bwd_ws && !tma)
    ran = plan::find_kernel(plan::KernelKind::sm90_bwd, 64, 128, int(pr.head_dim));
  // The warp-specialized rows write dK and dV through shared memory and TMA stores (tile_bwd.cuh, store_dkdv_smem)
  // where dk and dv admit tensor maps and are written, not added to (dkv_accumulate, a compound plan's later tile
  // part: each thread adds its pairs, store_dkdv).
  const bool epi = tma && plan::kKernels[ran].kind == plan::KernelKind::sm90_bwd_ws && !dkv_accumulate &&
                   encode_tmap(p.tmap_dk, dk, 64) && encode_tmap(p.tmap_dv, dv, 64);
  // dQ's first writes stored by their owners where the lists have them (plan::dq_owners; its rule and measurements at
  // plan::kOwnerMaxEntries): the D = 128 row on its persistent grid (every item taken in order from the counter, so an
  // owner's item is running or done when a step waits on it).
  if (g_dq_owner_mode.load() > 0 && l.dq_owner && l.dq_ready && epi && l.work_counter && pr.head_dim == 128 &&
      plan::kKernels[ran].kind == plan::KernelKind::sm90_bwd_ws) {
    p.dq_owner = l.dq_owner, p.dq_ready = l.dq_ready, p.dq_rev = l.dq_rev ? 1 : 0;
    ++g_dq_owner;
  }
  launch_row(ran, q.dtype == DType::bf16, tma, strips, epi, p, s, std::make_integer_sequence<int, plan::kNumKernels>{});
  return ran;
}

int TileBackward::set_prepfin_grid_limit(int limit) {
  if (limit < 1 || limit > 65535)
    throw Error("backward: prep / finish grid limit " + std::to_string(limit) + " not in [1, 65535]");
  return g_grid_limit.exchange(limit);
}

TileBackward::PrepFinCounts TileBackward::prepfin_counts() {
  return {g_prepfin[0].load(), g_prepfin[1].load(), g_prepfin[2].load()};
}

int64_t TileBackward::smem_epilogue_launches() { return g_smem_epi.load(); }

TileBackward::FinishTileCounts TileBackward::finish_tile_counts() {
  return {g_fin_tile[0].load(), g_fin_tile[1].load()};
}

int64_t TileBackward::dq_owner_launches() { return g_dq_owner.load(); }
int TileBackward::set_dq_owner_mode(int mode) {
  if (mode < 0 || mode > 2) throw Error("backward: dQ owner mode " + std::to_string(mode) + " not 0, 1 or 2");
  return g_dq_owner_mode.exchange(mode);
}
int64_t TileBackward::persistent_launches() { return g_persist.load(); }
int TileBackward::last_persistent_grid() { return g_persist_grid.load(); }
int TileBackward::set_persistent_grid_limit(int limit) {
  if (limit < 0) throw Error("backward: persistent grid limit " + std::to_string(limit) + " negative");
  return g_persist_limit.exchange(limit);
}

}  // namespace spattn::cuda
