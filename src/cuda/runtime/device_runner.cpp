// cuda/runtime/device_runner.cpp — the GPU path of run-time masks (plan/runtime_mask.hpp, DeviceMaskRunner): a fused
// plan whose arrays are sized once for the shapes (a skeleton BlockPlan uploaded as a DevicePlan) and rewritten on the
// device at every call from the mask tensors (cuda/runtime/tile_lists.hpp), then the fused forward kernel chosen
// for the skeleton. Two small kernels and the forward a call, no synchronisation, no allocation: CUDA-graph
// capturable, and a replay reads the mask tensors' new contents.
#include <cuda_runtime.h>

#include <cstdlib>
#include <numeric>
#include <sstream>

#include "cuda/backward/tile_backward.hpp"
#include "cuda/common/buffer.hpp"
#include "cuda/common/check.hpp"
#include "cuda/common/device.hpp"
#include "plan/gpu/launch.hpp"
#include "cuda/fused/fused_fwd.hpp"
#include "cuda/runtime/tile_lists.hpp"
#include "plan/kernels.hpp"
#include "plan/runtime_mask.hpp"

namespace spattn::plan {
namespace {

using cuda::fused::DevicePlan;
using cuda::fused::FusedFwd;

// A skeleton BlockPlan of tile x tile tiles (128, or 64) for the problem's lengths with `lists` row-offset lists and
// `entries` entries (and bitmasks where `masks`): sizes and capacities only; every array is written on the device at
// each call.
BlockPlan skeleton(const Problem& pr, int64_t lists, int64_t entries, bool masks, int tile = 128) {
  BlockPlan hp;
  hp.block_m = tile, hp.block_n = tile;
  hp.q_len = pr.q_len, hp.k_len = pr.kv_len;
  hp.q_group = pr.q_len, hp.k_group = pr.kv_len;
  hp.q_tiles = (pr.q_len + tile - 1) / tile, hp.k_tiles = (pr.kv_len + tile - 1) / tile;
  hp.row_offsets.assign(size_t(lists * (hp.q_tiles + 1)), 0);
  hp.entries.assign(size_t(entries), TileEntry{0, kFull, 0, 0});
  if (masks) hp.masks.resize(size_t(entries * hp.words_per_mask()));  // left uninitialised: written before they are read
  // Work order: the last query tiles first (causal and banded masks give the later rows more keys; the lists are not
  // known here to order them longest first).
  hp.order.resize(size_t(hp.q_tiles));
  std::iota(hp.order.rbegin(), hp.order.rend(), 0);
  return hp;
}

std::unique_ptr<DevicePlan> upload(BlockPlan hp, const Problem& pr, int device) {
  const int row = choose_kernel(hp, pr.head_dim, cuda::device_info(device).cc, FusedOptions{});
  if (row < 0)
    throw Error("run-time masks: no fused kernel for " + std::to_string(hp.block_m) + "x" + std::to_string(hp.block_n) +
                " tiles at head dim " + std::to_string(pr.head_dim));
  return std::make_unique<DevicePlan>(std::move(hp), row);
}

// The band of a static spec (none: every pair), as kernel offsets clamped to [-(q_len + 1), k_len + 1].
bool spec_band(const MaskLayout& layout, const Problem& pr, int* lo, int* hi, std::string* why) {
  int64_t l = -(pr.q_len + 1), h = pr.kv_len + 1;
  if (!layout.spec.empty()) {
    const auto band = parse(layout.spec).bind(pr.q_len, pr.kv_len).band();
    if (!band) {
      *why = "spec '" + layout.spec + "' is not one band (the device path takes causal, local and their intersections)";
      return false;
    }
    l = std::max(band->first, l);
    h = std::min(band->second, h);
  }
  *lo = int(l), *hi = int(h);
  return true;
}

// The problem and views of list l of a mask of nb x nh lists, l = b nh + h (batch nb > 1: one batch element; heads
// nh > 1: nh is q_heads (one query head, its kv head for k-like views) or kv_heads (one kv head and its group of query
// heads)): q-like views are [B, L, Hq, .], k-like [B, L, Hkv, .], lse [B, Hq, L].
struct ListViews {
  Problem p;
  std::vector<TensorView> q_like, k_like;
  TensorView lse;
};
ListViews list_views(const Problem& pr, int64_t nb, int64_t nh, int64_t l, std::vector<TensorView> q_like,
                     std::vector<TensorView> k_like, TensorView lse) {
  const int64_t b = l / nh, h = l % nh;
  ListViews out{pr, std::move(q_like), std::move(k_like), lse};
  auto cut = [](TensorView& t, int axis, int64_t i) { t = t.data ? t.narrow(axis, i) : t; };
  auto span = [](TensorView& t, int axis, int64_t i0, int64_t i1) { t = t.data ? t.slice(axis, i0, i1) : t; };
  if (nb > 1) {
    out.p.batch = 1;
    for (TensorView& t : out.q_like) cut(t, 0, b);
    for (TensorView& t : out.k_like) cut(t, 0, b);
    cut(out.lse, 0, b);
  }
  if (nh > 1) {
    const int64_t qh = pr.q_heads / nh, kvh = h * pr.kv_heads / nh;  // query heads a list, and their kv head
    out.p.q_heads = qh, out.p.kv_heads = 1;
    for (TensorView& t : out.q_like) span(t, 2, h * qh, (h + 1) * qh);
    for (TensorView& t : out.k_like) cut(t, 2, kvh);
    span(out.lse, 1, h * qh, (h + 1) * qh);
  }
  return out;
}

// The backward's key-major lists (64-row query tiles, key tiles of key_tile keys: 128, the sm90_bwd_ws row, or 64, the
// sm90_bwd 64x64 row, which exists at head dim 64 only; `lists` of them, `capacity` entries and, where `bitmasks`, as
// many transposed bitmasks of 128-key tiles) and the tile backward's scratch, where such a row runs (row < 0: not).
struct KeyMajor {
  int row = -1;
  mutable int last_row = -1;
  int64_t q_tiles = 0, k_tiles = 0, capacity = 0;
  cuda::DeviceBuffer offsets, entries, masks, order, dq_acc, lse2, delta;
  // Each list's key-tile order (lists x k_tiles), written with the lists at every call where set by the caller
  // before launch (block masks' grid build); null: `order`, the identity.
  mutable const int32_t* list_order = nullptr;

  // Per-query-head lists under grouped-query attention (a block mask per head, top-k keys per query head): each
  // head's dK / dV go to a slot of these (group x B x Lk x D each), summed into its kv head's by sum_group.
  cuda::DeviceBuffer dk_part, dv_part;
  int64_t group = 1, slot = 0;
  Problem problem;
  // The lists' shape for the launch's head sections (plan::head_section): not known here; {1, 1} (even lists that
  // reach far: block masks) unless the runner says otherwise.
  ListShape shape;

  // parts: the masks may differ between the query heads of a kv group (the partials above are allocated).
  KeyMajor(const Problem& pr, int device, int64_t lists, int64_t capacity_, bool bitmasks, bool parts,
           int key_tile = 128)
      : problem(pr) {
    const cuda::DeviceScope scope(device);
    const int d = int(pr.head_dim);
    if (cuda::device_info(device).sm90a())
      row = key_tile == 128 ? first_kernel(KernelKind::sm90_bwd_ws, d) : find_kernel(KernelKind::sm90_bwd, 64, 64, d);
    if (row >= 0 && bwd_strips_only(kKernels[row])) row = -1;  // sm90_bwd_64x64_d128: query strips only
    if (row < 0) return;
    q_tiles = (pr.q_len + 63) / 64, k_tiles = (pr.kv_len + key_tile - 1) / key_tile, capacity = capacity_;
    std::vector<int32_t> ord(static_cast<size_t>(k_tiles));
    std::iota(ord.begin(), ord.end(), 0);
    order = cuda::DeviceBuffer::upload(ord);
    offsets = cuda::DeviceBuffer(size_t(lists * (k_tiles + 1)) * 8, "run-time backward lists");
    entries = cuda::DeviceBuffer(size_t(std::max<int64_t>(capacity, 1)) * 16, "run-time backward lists");
    if (bitmasks) masks = cuda::DeviceBuffer(size_t(std::max<int64_t>(capacity, 1)) * 128 * 8, "run-time backward bitmasks");
    const int64_t rows = pr.batch * pr.q_heads * q_tiles * 64;
    dq_acc = cuda::DeviceBuffer(size_t(checked_bytes("backward dQ accumulator", {rows, pr.head_dim}, 4)));
    lse2 = cuda::DeviceBuffer(size_t(rows) * 4);
    delta = cuda::DeviceBuffer(size_t(rows) * 4);
    group = pr.q_heads / pr.kv_heads;
    if (group > 1 && parts) {
      slot = pr.batch * pr.kv_len * pr.head_dim;
      const int64_t bytes = checked_bytes("grouped-query dK / dV partials", {group, slot}, dtype_size(pr.dtype));
      dk_part = cuda::DeviceBuffer(size_t(bytes), "run-time backward dK partials");
      dv_part = cuda::DeviceBuffer(size_t(bytes), "run-time backward dV partials");
    }
  }
  // The tile backward over list l's slice of the lists (already written on `stream`).
  void launch(const Problem& p, int64_t l, const TensorView& q, const TensorView& k, const TensorView& v,
              const TensorView& o, const TensorView& lse, const TensorView& dout, const TensorView& dq,
              const TensorView& dk, const TensorView& dv, Stream stream) const {
    cuda::TileBackward::DeviceLists d;
    d.col_offsets = offsets.get<int64_t>() + l * (k_tiles + 1), d.entries = entries.get<int>();
    d.masks = masks.get<unsigned long long>();
    d.order = list_order ? list_order + l * k_tiles : order.get<int32_t>();
    d.q_tiles = q_tiles, d.k_tiles = k_tiles;
    d.q_group = p.q_len, d.k_group = p.kv_len;
    d.shape = shape;
    d.dq_acc = dq_acc.get<float>(), d.lse2 = lse2.get<float>(), d.delta = delta.get<float>();
    bool tma = false;
    last_row = cuda::TileBackward::launch(p, row, d, q, k, v, o, lse, dout, dq, dk, dv, stream, &tma);
  }
  // launch() of list l on views w (backward_lists'): q, k, v, o, lse, dout, dq, dk, dv.
  void launch(const ListViews& w, int64_t l, Stream stream) const {
    launch(w.p, l, w.q_like[0], w.k_like[0], w.k_like[1], w.q_like[1], w.lse, w.q_like[2], w.q_like[3], w.k_like[2],
           w.k_like[3], stream);
  }
  // launch() for every list of `views` (backward_lists'), in order.
  void launch_all(const std::vector<ListViews>& views, Stream stream) const {
    for (size_t l = 0; l < views.size(); ++l) launch(views[l], int64_t(l), stream);
  }
  // List l of one query head (views w: batch element b, or every one where b < 0) with its dK / dV into slot g of
  // the partials (g: the head's place in its kv group); sum_group adds the group's slots into the kv head's.
  void launch_part(ListViews w, int64_t l, int64_t g, int64_t b, Stream stream) const {
    const TensorView& dk = w.k_like[2];
    const std::array<int64_t, 4> shape{problem.batch, problem.kv_len, 1, problem.head_dim};
    const int64_t off = g * slot * dtype_size(dk.dtype);
    w.k_like[2] = TensorView::contiguous(dk_part.get<char>() + off, dk.dtype, shape);
    w.k_like[3] = TensorView::contiguous(dv_part.get<char>() + off, w.k_like[3].dtype, shape);
    if (b >= 0) w.k_like[2] = w.k_like[2].narrow(0, b), w.k_like[3] = w.k_like[3].narrow(0, b);
    launch(w, l, stream);
  }
  void sum_group(const TensorView& dk, const TensorView& dv, int64_t kvh, Stream stream) const {
    for (auto [dst, src] : {std::pair{dk, &dk_part}, {dv, &dv_part}}) {
      const TensorView d = dst.narrow(2, kvh);
      cuda::runtime::GroupSumArgs a;
      a.src = src->get<char>(), a.dst = d.data;
      a.dst_s[0] = d.stride[0], a.dst_s[1] = d.stride[1], a.dst_s[2] = d.stride[3];
      a.group = int(group), a.batch = int(problem.batch), a.len = int(problem.kv_len), a.dim = int(problem.head_dim);
      a.bf16 = d.dtype == DType::bf16 ? 1 : 0;
      SPATTN_CUDA_CHECK(cudaError_t(cuda::runtime::launch_group_sum(a, stream)));
    }
  }
  std::string name() const { return last_row >= 0 ? kKernels[last_row].name : ""; }
};

// The backward calls a KeyMajor does not take, for host_cases().
std::string backward_host_cases(const KeyMajor& bwd, const char* none = "no sm_90a device") {
  return bwd.row < 0 ? std::string("; the backward (") + none + ")"
                     : "; a backward whose tensors the tile backward refuses (alignment, strides, dtypes)";
}

class DocumentRunner final : public DeviceMaskRunner {
 public:
  // Capacities: one set of boundaries needs tiles x per_row entries; separate key boundaries (cu_seqlens_k) up to
  // (tiles + n) x per_row (tile_lists.hpp, document_entries), so the arrays hold that for n up to the tile count.
  DocumentRunner(const Problem& pr, int device, int lo, int hi, int64_t per_row)
      : problem_(pr), device_(device), per_row_(per_row),
        per_col_(cuda::runtime::document_tiles_per_row(128, 64, -hi, -lo, (pr.q_len + 63) / 64)),
        bwd_(pr, device, 1,
             cuda::runtime::document_entries((pr.kv_len + 127) / 128, (pr.q_len + 63) / 64, per_col_,
                                             (pr.kv_len + 127) / 128, true),
             true, false) {
    const cuda::DeviceScope scope(device);
    const int64_t qt = (pr.q_len + 127) / 128, kt = (pr.kv_len + 127) / 128;
    capacity_ = cuda::runtime::document_entries(qt, kt, per_row, qt, true);
    plan_ = upload(skeleton(pr, 1, capacity_, true), pr, device);
    // Documents' lists reach within their documents: no head sections, as the static plan of the same pairs
    // (plan::list_shape: reach below a third of the other axis).
    plan_->set_list_shape({1, 0});
    bwd_.shape = {1, 0};
    args_.q_len = int(pr.q_len), args_.k_len = int(pr.kv_len);
    args_.q_tiles = int(plan_->host().q_tiles);
    args_.lo = lo, args_.hi = hi;
    args_.entry_capacity = capacity_;
    args_.row_offsets = const_cast<int64_t*>(plan_->row_offsets());
    args_.entries = const_cast<int*>(reinterpret_cast<const int*>(plan_->entries()));
    args_.masks = const_cast<unsigned long long*>(plan_->masks());
  }

  // The call's boundaries into `a`; false where the device path does not take them (more documents with separate
  // key boundaries than the arrays hold: `outer` tiles of `inner` partners, per_row each, within `capacity`).
  static bool read_mask(const RuntimeMask& mask, cuda::runtime::DocTileArgs& a, int64_t outer, int64_t inner,
                        int64_t per_row, int64_t capacity) {
    const IndexView &cu = mask.cu_seqlens_q, &ck = mask.cu_seqlens_k;
    if (!cu.present() || cu.ndim != 1 || cu.shape[0] < 1 || cu.shape[0] > (1 << 30)) return false;
    if (ck.present() && (ck.ndim != 1 || ck.shape[0] != cu.shape[0])) return false;
    const int64_t n = cu.shape[0] - 1;
    if (cuda::runtime::document_entries(outer, inner, per_row, n, ck.present()) > capacity) return false;
    a.cu = cu.data, a.cu_bits = cu.bits, a.cu_stride = cu.stride[0];
    a.cu_k = ck.present() ? ck.data : nullptr, a.cu_k_bits = ck.bits, a.cu_k_stride = ck.stride[0];
    a.documents = int(n);
    return true;
  }

  bool forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView& lse, const RuntimeMask& mask, Stream stream) const override {
    cuda::runtime::DocTileArgs a = args_;
    if (!read_mask(mask, a, args_.q_tiles, (problem_.kv_len + 127) / 128, per_row_, capacity_)) return false;
    const cuda::DeviceScope scope(device_);
    FusedFwd::Arguments fa{problem_, q, k, v, o, lse};
    FusedFwd::Params params;
    const auto st = FusedFwd::can_implement(fa, *plan_, &params);
    if (!st.ok) throw Error("run-time documents: " + st.reason);
    SPATTN_CUDA_CHECK(cudaError_t(cuda::runtime::launch_document_tiles(a, stream)));
    FusedFwd::run(params, static_cast<cudaStream_t>(stream));
    return true;
  }
  bool backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, const RuntimeMask& mask, Stream stream) const override {
    cuda::runtime::DocTileArgs a = args_;  // key-major: "query tiles" are the key tiles, block_m the 64-row query tile
    if (bwd_.row < 0 || !read_mask(mask, a, bwd_.k_tiles, bwd_.q_tiles, per_col_, bwd_.capacity)) return false;
    const cuda::DeviceScope scope(device_);
    if (!cuda::TileBackward::refusal(problem_, q, k, v, o, lse, dout, dq, dk, dv).empty()) return false;
    a.block_m = 64, a.block_n = 128;
    a.q_tiles = int(bwd_.k_tiles);
    a.entry_capacity = bwd_.capacity;
    a.row_offsets = bwd_.offsets.get<int64_t>();
    a.entries = bwd_.entries.get<int>();
    a.masks = bwd_.masks.get<unsigned long long>();
    SPATTN_CUDA_CHECK(cudaError_t(cuda::runtime::launch_document_key_tiles(a, stream)));
    bwd_.launch(problem_, 0, q, k, v, o, lse, dout, dq, dk, dv, stream);
    return true;
  }
  std::string backward_kernel() const override { return bwd_.name(); }
  std::string kernel() const override { return kKernels[plan_->kernel_row()].name; }
  std::string host_cases() const override {
    const int64_t qt = args_.q_tiles, kt = (problem_.kv_len + 127) / 128;
    const bool dense = per_row_ >= kt;  // no window: every document count fits the arrays
    return (dense ? std::string("none in the forward")
                  : "cu_seqlens_k with more than " + std::to_string(std::min(qt, kt)) +
                        " documents (the lists' capacity under a window: one document a tile)") +
           backward_host_cases(bwd_);
  }
  std::string explain() const override {
    std::ostringstream s;
    s << "device tile lists of packed documents (128x128 tiles, band " << args_.lo << ".." << args_.hi << ", up to "
      << capacity_ << " entries and bitmasks, written at each call), kernel " << kernel() << "; backward "
      << (bwd_.row >= 0 ? std::string("key-major lists written likewise (up to ") + std::to_string(bwd_.capacity) +
                              " entries), " + kKernels[bwd_.row].name
                        : std::string("on the host path (no sm_90a device)"));
    return s.str();
  }

 private:
  Problem problem_;
  int device_;
  int64_t per_row_, per_col_;  // the most partner tiles a (document, tile) pair has: forward, key-major
  int64_t capacity_ = 0;
  std::unique_ptr<DevicePlan> plan_;
  cuda::runtime::DocTileArgs args_;
  KeyMajor bwd_;
};

// The fused forward's launches of the nb x nh lists of the mask (each list's row offsets: its slice of the plan's,
// list l of the plan; where batch_lists, the plan holds a list a batch element, l / nh, rewritten for each head).
std::vector<FusedFwd::Params> list_launches(const DevicePlan& plan, const Problem& pr, int64_t nb, int64_t nh,
                                            const TensorView& q, const TensorView& k, const TensorView& v,
                                            const TensorView& o, const TensorView& lse, const char* what,
                                            bool batch_lists = false) {
  std::vector<FusedFwd::Params> launches;
  const int64_t rows = plan.host().q_tiles + 1;
  for (int64_t l = 0; l < nb * nh; ++l) {
    const ListViews w = list_views(pr, nb, nh, l, {q, o}, {k, v}, lse);
    FusedFwd::Params params;
    const auto st = FusedFwd::can_implement(
        FusedFwd::Arguments{w.p, w.q_like[0], w.k_like[0], w.k_like[1], w.q_like[1], w.lse}, plan, &params);
    if (!st.ok) throw Error(std::string(what) + ": " + st.reason);
    params.kernel.row_offsets = plan.row_offsets() + (batch_lists ? l / nh : l) * rows;
    launches.push_back(params);
  }
  return launches;
}

// The backward's views of the nb x nh lists; empty where the tile backward refuses one (then the host path runs).
std::vector<ListViews> backward_lists(const Problem& pr, int64_t nb, int64_t nh, const TensorView& q,
                                      const TensorView& k, const TensorView& v, const TensorView& o,
                                      const TensorView& lse, const TensorView& dout, const TensorView& dq,
                                      const TensorView& dk, const TensorView& dv) {
  std::vector<ListViews> views;
  for (int64_t l = 0; l < nb * nh; ++l) {
    views.push_back(list_views(pr, nb, nh, l, {q, o, dout, dq}, {k, v, dk, dv}, lse));
    const ListViews& w = views.back();
    if (!cuda::TileBackward::refusal(w.p, w.q_like[0], w.k_like[0], w.k_like[1], w.q_like[1], w.lse, w.q_like[2],
                                     w.q_like[3], w.k_like[2], w.k_like[3]).empty())
      return {};
  }
  return views;
}

// SPATTN_RT_KEY_LISTS, read at every call (the A/B of issue 44): block masks' lists by the one-CTA builds, not the
// grid builds: "cta" both, "fwd" the forward's, "bwd" the backward's (then in identity order).
bool one_cta_lists(const char* side) {
  const char* env = std::getenv("SPATTN_RT_KEY_LISTS");
  return env && (std::string(env) == "cta" || std::string(env) == side);
}

// Block masks: one list a (batch, head) of the mask, written across the grid (tile_lists.hpp); the fused forward
// launched once a list on that list's batch and head (all of them where the mask broadcasts over them: one launch for
// a [1, 1, NQ] mask).
class BlockRunner final : public DeviceMaskRunner {
 public:
  // block: 128 or 64 (the forward on tiles of the block; the backward on 64-row query tiles and key tiles of the
  // block: at block 64 the sm90_bwd 64x64 row, head dim 64 only, else the host path).
  BlockRunner(const Problem& pr, int device, bool band, int lo, int hi, int block)
      : problem_(pr), device_(device),
        bwd_(pr, device, pr.batch * pr.q_heads,
             pr.batch * pr.q_heads * ((pr.q_len + 63) / 64) * ((pr.kv_len + block - 1) / block), false, true, block) {
    const cuda::DeviceScope scope(device);
    const int64_t qt = (pr.q_len + block - 1) / block, kt = (pr.kv_len + block - 1) / block;
    plan_ = upload(skeleton(pr, pr.batch * pr.q_heads, pr.batch * pr.q_heads * qt * kt, false, block), pr, device);
    args_.block_m = args_.block_n = block;
    args_.q_len = int(pr.q_len), args_.k_len = int(pr.kv_len);
    args_.q_tiles = int(qt), args_.k_tiles = int(kt);
    args_.band = band ? 1 : 0, args_.lo = lo, args_.hi = hi;
    args_.list_capacity = qt * kt;
    args_.row_offsets = const_cast<int64_t*>(plan_->row_offsets());
    args_.entries = const_cast<int*>(reinterpret_cast<const int*>(plan_->entries()));
    // The grid builds' scratch (tile_lists.hpp, BlockKeyScratch; marks zero between calls): the forward's (a row
    // of marks a query tile) and the backward's (a row a key tile, and its orders), apart.
    const int64_t lists = pr.batch * pr.q_heads;
    fwd_scratch_ = grid_scratch(lists, qt, (kt + 31) / 32, fwd_marks_, fwd_counts_, "run-time forward");
    if (bwd_.row >= 0) {
      scratch_ = grid_scratch(lists, kt, (qt + 31) / 32, marks_, counts_, "run-time backward");
      orders_ = cuda::DeviceBuffer(size_t(lists * kt) * 4, "run-time backward orders");
      scratch_.order = orders_.get<int32_t>();
    }
  }
  static cuda::runtime::BlockKeyScratch grid_scratch(int64_t lists, int64_t rows, int64_t words,
                                                     cuda::DeviceBuffer& marks, cuda::DeviceBuffer& counts,
                                                     const std::string& what) {
    const size_t mark_bytes = size_t(lists * 2 * rows * words) * 4;
    marks = cuda::DeviceBuffer(mark_bytes, (what + " marks").c_str());
    SPATTN_CUDA_CHECK(cudaMemset(marks.get<char>(), 0, mark_bytes));
    counts = cuda::DeviceBuffer(size_t(lists * rows) * 4, (what + " counts").c_str());
    cuda::runtime::BlockKeyScratch s;
    s.marks = marks.get<unsigned>(), s.counts = counts.get<int>(), s.words = words;
    return s;
  }

  // The mask's tensors into `a` (its lists nb x nh); false where the device path does not take their shapes.
  bool read_mask(const RuntimeMask& mask, cuda::runtime::BlockTileArgs& a, int64_t* nb_out, int64_t* nh_out) const {
    const IndexView &num = mask.kv_num_blocks, &idx = mask.kv_indices, &fnum = mask.full_kv_num_blocks,
                    &fidx = mask.full_kv_indices;
    const Problem& pr = problem_;
    if (!num.present() || !idx.present() || num.ndim != 3 || idx.ndim != 4 || fnum.present() != fidx.present())
      return false;
    const int64_t nb = num.shape[0], nh = num.shape[1];
    if ((nb != 1 && nb != pr.batch) || (nh != 1 && nh != pr.q_heads) || num.shape[2] < args_.q_tiles) return false;
    for (int i = 0; i < 3; ++i)
      if (idx.shape[size_t(i)] != num.shape[size_t(i)]) return false;
    if (fnum.present() && (fnum.ndim != 3 || fidx.ndim != 4 || fnum.shape != num.shape || fidx.shape[0] != nb ||
                           fidx.shape[1] != nh || fidx.shape[2] != num.shape[2]))
      return false;
    a.num = num.data, a.num_bits = num.bits, a.idx = idx.data, a.idx_bits = idx.bits;
    a.cap = int(idx.shape[3]);
    for (int i = 0; i < 3; ++i) a.num_s[i] = num.shape[size_t(i)] == 1 ? 0 : num.stride[size_t(i)];
    for (int i = 0; i < 4; ++i) a.idx_s[i] = idx.shape[size_t(i)] == 1 && i < 3 ? 0 : idx.stride[size_t(i)];
    if (fnum.present()) {
      a.full_num = fnum.data, a.full_num_bits = fnum.bits, a.full_idx = fidx.data, a.full_idx_bits = fidx.bits;
      a.full_cap = int(fidx.shape[3]);
      for (int i = 0; i < 3; ++i) a.full_num_s[i] = fnum.shape[size_t(i)] == 1 ? 0 : fnum.stride[size_t(i)];
      for (int i = 0; i < 4; ++i) a.full_idx_s[i] = fidx.shape[size_t(i)] == 1 && i < 3 ? 0 : fidx.stride[size_t(i)];
    }
    a.heads = int(nh), a.lists = int(nb * nh);
    *nb_out = nb, *nh_out = nh;
    return true;
  }

  bool backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, const RuntimeMask& mask, Stream stream) const override {
    cuda::runtime::BlockTileArgs a = args_;
    int64_t nb = 0, nh = 0;
    if (bwd_.row < 0 || !read_mask(mask, a, &nb, &nh)) return false;
    const Problem& pr = problem_;
    const cuda::DeviceScope scope(device_);
    const std::vector<ListViews> views = backward_lists(pr, nb, nh, q, k, v, o, lse, dout, dq, dk, dv);
    if (views.empty()) return false;
    a.block_m = 64;  // the backward's query tiles; the mask's blocks (and key tiles) stay as they are
    a.row_offsets = bwd_.offsets.get<int64_t>();
    a.entries = bwd_.entries.get<int>();
    a.list_capacity = bwd_.q_tiles * bwd_.k_tiles;
    if (one_cta_lists("bwd")) {  // the one-CTA build, identity order
      bwd_.list_order = nullptr;
      SPATTN_CUDA_CHECK(cudaError_t(cuda::runtime::launch_block_key_tiles(a, args_.q_tiles, args_.block_m, stream)));
    } else {
      bwd_.list_order = scratch_.order;
      SPATTN_CUDA_CHECK(cudaError_t(
          cuda::runtime::launch_block_key_tiles_grid(a, args_.q_tiles, args_.block_m, scratch_, stream)));
    }
    if (nh == 1 || pr.q_heads == pr.kv_heads) {
      bwd_.launch_all(views, stream);
      return true;
    }
    // Per-head lists under GQA: a launch sums the heads of its kv group into their dK / dV, so each query head's
    // go to its slot of the partials, then the group's slots are summed into the kv head's.
    for (int64_t kvh = 0; kvh < pr.kv_heads; ++kvh) {
      for (int64_t g = 0; g < bwd_.group; ++g)
        for (int64_t b = 0; b < nb; ++b) {
          const int64_t l = b * nh + kvh * bwd_.group + g;
          bwd_.launch_part(views[size_t(l)], l, g, nb > 1 ? b : -1, stream);
        }
      bwd_.sum_group(dk, dv, kvh, stream);
    }
    return true;
  }
  std::string backward_kernel() const override { return bwd_.name(); }

  bool forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView& lse, const RuntimeMask& mask, Stream stream) const override {
    cuda::runtime::BlockTileArgs a = args_;
    int64_t nb = 0, nh = 0;
    if (!read_mask(mask, a, &nb, &nh)) return false;
    const Problem& pr = problem_;
    const cuda::DeviceScope scope(device_);
    // Every launch's parameters first (checks, tensor maps), then the lists' kernel and the launches.
    const std::vector<FusedFwd::Params> launches =
        list_launches(*plan_, pr, nb, nh, q, k, v, o, lse, "run-time block mask");
    SPATTN_CUDA_CHECK(cudaError_t(one_cta_lists("fwd") ? cuda::runtime::launch_block_tiles(a, stream)
                                                  : cuda::runtime::launch_block_tiles_grid(a, fwd_scratch_, stream)));
    for (const FusedFwd::Params& params : launches) FusedFwd::run(params, static_cast<cudaStream_t>(stream));
    return true;
  }
  std::string kernel() const override { return kKernels[plan_->kernel_row()].name; }
  std::string host_cases() const override {
    return "none in the forward" +
           backward_host_cases(bwd_, args_.block_m == 64 ? "64 x 64 blocks at head dim 128, or no sm_90a device: the "
                                                           "64x64 tile backward is sm90_bwd_64x64_d64's"
                                                         : "no sm_90a device");
  }
  std::string explain() const override {
    std::ostringstream s;
    s << "device tile lists of block masks (" << args_.block_m << "x" << args_.block_n
      << " blocks and tiles, one list a (batch, head) of the mask, partial "
         "blocks "
      << (args_.band ? "banded " + std::to_string(args_.lo) + ".." + std::to_string(args_.hi) : std::string("whole"))
      << ", written at each call across the grid: marks, counts, offsets, entries), kernel " << kernel()
      << ", a launch a list; backward "
      << (bwd_.row >= 0 ? std::string("from key-major lists written likewise (the key tiles run most entries "
                                      "first), ") +
                              kKernels[bwd_.row].name +
                              (bwd_.group > 1 ? " (per-head lists under GQA: each head's dK / dV partials summed over "
                                                "its kv group)"
                                              : "")
                        : std::string("on the host path"));
    return s.str();
  }

 private:
  Problem problem_;
  int device_;
  std::unique_ptr<DevicePlan> plan_;
  cuda::runtime::BlockTileArgs args_;
  KeyMajor bwd_;
  cuda::DeviceBuffer marks_, counts_, orders_, fwd_marks_, fwd_counts_;
  cuda::runtime::BlockKeyScratch scratch_, fwd_scratch_;
};

// Top-k keys: every tile's bitmask set by the pairs on the device (a list a batch element, the heads sharing it), the
// flagged tiles listed; the fused forward a launch a list; the backward from transposed bitmasks set likewise.
class TopkRunner final : public DeviceMaskRunner {
 public:
  TopkRunner(const Problem& pr, int device, int64_t K, bool band, int lo, int hi)
      : problem_(pr), device_(device), topk_(K),
        bwd_(pr, device, pr.batch, pr.batch * ((pr.kv_len + 127) / 128) * ((pr.q_len + 63) / 64), true, true) {
    const cuda::DeviceScope scope(device);
    const int64_t qt = (pr.q_len + 127) / 128, kt = (pr.kv_len + 127) / 128;
    plan_ = upload(skeleton(pr, pr.batch, pr.batch * qt * kt, true), pr, device);
    flags_ = cuda::DeviceBuffer(size_t(pr.batch * qt * kt), "run-time top-k flags");
    if (bwd_.row >= 0) key_flags_ = cuda::DeviceBuffer(size_t(pr.batch * kt * bwd_.q_tiles), "run-time top-k flags");
    args_.topk = int(K), args_.lists = int(pr.batch);
    args_.q_len = int(pr.q_len), args_.k_len = int(pr.kv_len);
    args_.band = band ? 1 : 0, args_.lo = lo, args_.hi = hi;
    args_.q_tiles = int(qt), args_.k_tiles = int(kt), args_.q_tiles64 = int((pr.q_len + 63) / 64);
  }

  // The call's indices into a copy of args_ (masks and lists unset), with their head count (1, kv_heads or
  // q_heads) and head stride; false where the device path does not take them.
  bool read_mask(const RuntimeMask& mask, cuda::runtime::TopkTileArgs& a, int64_t* heads, int64_t* head_stride) const {
    const IndexView& t = mask.topk_indices;
    const Problem& pr = problem_;
    if (!t.present() || (t.ndim != 3 && t.ndim != 4) || t.shape[0] != pr.batch || t.shape[1] != pr.q_len ||
        t.shape[size_t(t.ndim - 1)] != topk_)
      return false;
    *heads = t.ndim == 4 ? t.shape[2] : 1;
    *head_stride = t.ndim == 4 ? t.stride[2] : 0;
    if (*heads != 1 && *heads != pr.kv_heads && *heads != pr.q_heads) return false;
    a = args_;
    a.idx = t.data, a.idx_bits = t.bits;
    a.idx_s[0] = t.stride[0], a.idx_s[1] = t.stride[1], a.idx_s[2] = t.stride[size_t(t.ndim - 1)];
    return true;
  }
  // `a` reading head h's lists (the heads' lists are written one head at a time into the same arrays).
  static cuda::runtime::TopkTileArgs head_args(cuda::runtime::TopkTileArgs a, int64_t h, int64_t head_stride) {
    a.idx = static_cast<const char*>(a.idx) + h * head_stride * (a.idx_bits / 8);
    return a;
  }

  bool forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView& lse, const RuntimeMask& mask, Stream stream) const override {
    cuda::runtime::TopkTileArgs a;
    int64_t nh = 1, hs = 0;
    if (!read_mask(mask, a, &nh, &hs)) return false;
    const cuda::DeviceScope scope(device_);
    const Problem& pr = problem_;
    // Every launch's parameters first (checks, tensor maps): list b of the plan for batch element b of each head.
    const std::vector<FusedFwd::Params> launches =
        list_launches(*plan_, pr, pr.batch, nh, q, k, v, o, lse, "run-time top-k keys", true);
    a.masks = const_cast<unsigned long long*>(plan_->masks());
    a.flags = flags_.get<unsigned char>();
    a.row_offsets = const_cast<int64_t*>(plan_->row_offsets());
    a.entries = const_cast<int*>(reinterpret_cast<const int*>(plan_->entries()));
    for (int64_t h = 0; h < nh; ++h) {  // a head's lists, then its launches
      SPATTN_CUDA_CHECK(cudaError_t(cuda::runtime::launch_topk_tiles(head_args(a, h, hs), stream)));
      for (int64_t b = 0; b < pr.batch; ++b)
        FusedFwd::run(launches[size_t(b * nh + h)], static_cast<cudaStream_t>(stream));
    }
    return true;
  }

  bool backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, const RuntimeMask& mask, Stream stream) const override {
    cuda::runtime::TopkTileArgs a;
    int64_t nh = 1, hs = 0;
    if (bwd_.row < 0 || !read_mask(mask, a, &nh, &hs)) return false;
    const cuda::DeviceScope scope(device_);
    const Problem& pr = problem_;
    const std::vector<ListViews> views = backward_lists(pr, pr.batch, nh, q, k, v, o, lse, dout, dq, dk, dv);
    if (views.empty()) return false;
    a.key_masks = bwd_.masks.get<unsigned long long>();
    a.key_flags = key_flags_.get<unsigned char>();
    a.key_offsets = bwd_.offsets.get<int64_t>();
    a.key_entries = bwd_.entries.get<int>();
    const bool parts = nh == pr.q_heads && pr.q_heads != pr.kv_heads;  // per query head under GQA
    // Head h's lists (list b: batch element b), then its launches; per query head under GQA, each head's dK / dV
    // into its slot of the partials and the kv group's summed after its last head.
    for (int64_t h = 0; h < nh; ++h) {
      SPATTN_CUDA_CHECK(cudaError_t(cuda::runtime::launch_topk_tiles(head_args(a, h, hs), stream)));
      for (int64_t b = 0; b < pr.batch; ++b) {
        const ListViews& w = views[size_t(b * nh + h)];
        if (parts)
          bwd_.launch_part(w, b, h % bwd_.group, pr.batch > 1 ? b : -1, stream);
        else
          bwd_.launch(w, b, stream);
      }
      if (parts && h % bwd_.group == bwd_.group - 1) bwd_.sum_group(dk, dv, h / bwd_.group, stream);
    }
    return true;
  }
  std::string backward_kernel() const override { return bwd_.name(); }
  std::string kernel() const override { return kKernels[plan_->kernel_row()].name; }
  std::string host_cases() const override { return "none in the forward" + backward_host_cases(bwd_); }
  std::string explain() const override {
    return "device bitmasks of top-" + std::to_string(topk_) + " keys (every 128 x 128 tile's bits set by the pairs, " +
           "the tiles holding any listed as entries, a list a batch element; indices per kv or query head written " +
           "and run a head at a time), kernel " + kernel() + "; backward " +
           (bwd_.row >= 0 ? std::string("from transposed bitmasks set likewise, ") + kKernels[bwd_.row].name
                          : std::string("on the host path (no sm_90a device)"));
  }

 private:
  Problem problem_;
  int device_;
  int64_t topk_;
  KeyMajor bwd_;
  std::unique_ptr<DevicePlan> plan_;
  cuda::DeviceBuffer flags_, key_flags_;
  cuda::runtime::TopkTileArgs args_;
};

}  // namespace

std::unique_ptr<DeviceMaskRunner> make_device_mask_runner(const MaskLayout& layout, const Problem& pr, int device,
                                                          std::string* why) {
  std::string r;
  auto refuse = [&](std::string reason) -> std::unique_ptr<DeviceMaskRunner> {
    if (why) *why = std::move(reason);
    return nullptr;
  };
  // The runners' uploads (pageable cudaMemcpy) and zeroing (cudaMemset) run on the legacy default stream and may
  // return before they land; a non-blocking stream (a torch side stream, torch.cuda.graph's warm-up) does not wait
  // for that stream, so its first call could read them early. Wait for it once, here at plan time (as
  // fused_fwd.cpp does after its uploads); never on the per-call path.
  auto ready = [&](std::unique_ptr<DeviceMaskRunner> runner) {
    const cuda::DeviceScope scope(device);
    SPATTN_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    return runner;
  };
  if (pr.dtype != DType::bf16 && pr.dtype != DType::f16) return refuse("dtype " + std::string(dtype_name(pr.dtype)));
  if ((pr.head_dim != 64 && pr.head_dim != 128) || pr.dv() != pr.head_dim) return refuse("head dim");
  int lo = 0, hi = 0;
  if (!spec_band(layout, pr, &lo, &hi, &r)) return refuse(r);
  if (layout.kind == MaskKind::topk) {
    const int64_t tiles = pr.batch * ((pr.q_len + 127) / 128) * ((pr.kv_len + 127) / 128);
    if (tiles * 2 * 2048 > (int64_t(1) << 31))  // forward and transposed bitmasks, 2 KiB a tile each
      return refuse("its bitmasks (" + std::to_string(tiles * 4096 >> 20) + " MiB) are past 2 GiB");
    if (!layout.spec.empty() && int64_t(hi) - lo > 8192) return refuse("a spec band wider than 8192 keys");
    return ready(std::make_unique<TopkRunner>(pr, device, layout.topk, !layout.spec.empty(), lo, hi));
  }
  if (layout.kind == MaskKind::blocks) {
    const int64_t b = layout.q_block;
    if (b != layout.k_block || (b != 128 && b != 64)) return refuse("blocks other than 128 x 128 or 64 x 64");
    const int64_t bytes = pr.batch * pr.q_heads * ((pr.q_len + b - 1) / b) * ((pr.kv_len + b - 1) / b) * 16;
    if (bytes > (int64_t(1) << 30)) return refuse("its list capacity (" + std::to_string(bytes >> 20) + " MiB) is past 1 GiB");
    return ready(std::make_unique<BlockRunner>(pr, device, !layout.spec.empty(), lo, hi, int(b)));
  }
  const int64_t q_tiles = (pr.q_len + 127) / 128, k_tiles = (pr.kv_len + 127) / 128;
  const int64_t per_row = cuda::runtime::document_tiles_per_row(128, 128, lo, hi, k_tiles);
  const int64_t mask_bytes = cuda::runtime::document_entries(q_tiles, k_tiles, per_row, q_tiles, true) * 128 * 128 / 8;
  if (mask_bytes > (int64_t(1) << 30))
    return refuse("its bitmask capacity (" + std::to_string(mask_bytes >> 20) + " MiB) is past 1 GiB");
  return ready(std::make_unique<DocumentRunner>(pr, device, lo, hi, per_row));
}

}  // namespace spattn::plan
