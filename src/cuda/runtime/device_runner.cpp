// cuda/runtime/device_runner.cpp — the GPU path of run-time masks (plan/runtime_mask.hpp, DeviceMaskRunner): a fused
// plan whose arrays are sized once for the shapes (a skeleton BlockPlan uploaded as a DevicePlan) and rewritten on the
// device at every call from the mask tensors (cuda/runtime/tile_lists.hpp), then the fused forward kernel chosen
// for the skeleton. Two small kernels and the forward a call, no synchronisation, no allocation: CUDA-graph
// capturable, and a replay reads the mask tensors' new contents.
#include <cuda_runtime.h>

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

// The problem and views of list l of a mask of nb x nh lists (batch nb > 1: one batch element; heads nh > 1: one
// query head, its kv head for k-like views): q-like views are [B, L, Hq, .], k-like [B, L, Hkv, .], lse [B, Hq, L].
struct ListViews {
  Problem p;
  std::vector<TensorView> q_like, k_like;
  TensorView lse;
};
ListViews list_views(const Problem& pr, int64_t nb, int64_t nh, int64_t l, std::vector<TensorView> q_like,
                     std::vector<TensorView> k_like, TensorView lse) {
  const int64_t b = l / nh, h = l % nh, group = pr.q_heads / pr.kv_heads;
  ListViews out{pr, std::move(q_like), std::move(k_like), lse};
  auto cut = [](TensorView& t, int axis, int64_t i) { t = t.data ? t.narrow(axis, i) : t; };
  if (nb > 1) {
    out.p.batch = 1;
    for (TensorView& t : out.q_like) cut(t, 0, b);
    for (TensorView& t : out.k_like) cut(t, 0, b);
    cut(out.lse, 0, b);
  }
  if (nh > 1) {
    out.p.q_heads = out.p.kv_heads = 1;
    for (TensorView& t : out.q_like) cut(t, 2, h);
    for (TensorView& t : out.k_like) cut(t, 2, h / group);
    cut(out.lse, 1, h);
  }
  return out;
}

// The backward's key-major lists (64-row query tiles, 128-key tiles; `lists` of them, `capacity` entries and, where
// `bitmasks`, as many transposed bitmasks) and the tile backward's scratch, where its sm_90a rows run (row < 0: not).
struct KeyMajor {
  int row = -1;
  mutable int last_row = -1;
  int64_t q_tiles = 0, k_tiles = 0, capacity = 0;
  cuda::DeviceBuffer offsets, entries, masks, order, dq_acc, lse2, delta;

  KeyMajor(const Problem& pr, int device, int64_t lists, int64_t capacity_, bool bitmasks, bool wanted = true) {
    const cuda::DeviceScope scope(device);
    row = wanted && cuda::device_info(device).sm90a() ? first_kernel(KernelKind::sm90_bwd_ws, int(pr.head_dim)) : -1;
    if (row < 0) return;
    q_tiles = (pr.q_len + 63) / 64, k_tiles = (pr.kv_len + 127) / 128, capacity = capacity_;
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
  }
  // The tile backward over list l's slice of the lists (already written on `stream`).
  void launch(const Problem& p, int64_t l, const TensorView& q, const TensorView& k, const TensorView& v,
              const TensorView& o, const TensorView& lse, const TensorView& dout, const TensorView& dq,
              const TensorView& dk, const TensorView& dv, Stream stream) const {
    cuda::TileBackward::DeviceLists d;
    d.col_offsets = offsets.get<int64_t>() + l * (k_tiles + 1), d.entries = entries.get<int>();
    d.masks = masks.get<unsigned long long>(), d.order = order.get<int32_t>();
    d.q_tiles = q_tiles, d.k_tiles = k_tiles;
    d.q_group = p.q_len, d.k_group = p.kv_len;
    d.dq_acc = dq_acc.get<float>(), d.lse2 = lse2.get<float>(), d.delta = delta.get<float>();
    bool tma = false;
    last_row = cuda::TileBackward::launch(p, row, d, q, k, v, o, lse, dout, dq, dk, dv, stream, &tma);
  }
  // launch() for every list of `views` (backward_lists'), in order.
  void launch_all(const std::vector<ListViews>& views, Stream stream) const {
    for (size_t l = 0; l < views.size(); ++l) {
      const ListViews& w = views[l];
      launch(w.p, int64_t(l), w.q_like[0], w.k_like[0], w.k_like[1], w.q_like[1], w.lse, w.q_like[2], w.q_like[3],
             w.k_like[2], w.k_like[3], stream);
    }
  }
  std::string name() const { return last_row >= 0 ? kKernels[last_row].name : ""; }
};

class DocumentRunner final : public DeviceMaskRunner {
 public:
  DocumentRunner(const Problem& pr, int device, int lo, int hi, int64_t per_row)
      : problem_(pr), device_(device),
        bwd_(pr, device, 1, (pr.kv_len + 127) / 128 * cuda::runtime::document_tiles_per_row(128, 64, -hi, -lo, (pr.q_len + 63) / 64),
             true) {
    const cuda::DeviceScope scope(device);
    capacity_ = (pr.q_len + 127) / 128 * per_row;
    plan_ = upload(skeleton(pr, 1, capacity_, true), pr, device);
    args_.q_len = int(pr.q_len), args_.k_len = int(pr.kv_len);
    args_.q_tiles = int(plan_->host().q_tiles);
    args_.lo = lo, args_.hi = hi;
    args_.entry_capacity = capacity_;
    args_.row_offsets = const_cast<int64_t*>(plan_->row_offsets());
    args_.entries = const_cast<int*>(reinterpret_cast<const int*>(plan_->entries()));
    args_.masks = const_cast<unsigned long long*>(plan_->masks());
  }

  bool forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView& lse, const RuntimeMask& mask, Stream stream) const override {
    const IndexView& cu = mask.cu_seqlens_q;
    if (!cu.present() || mask.cu_seqlens_k.present() || cu.ndim != 1 || cu.shape[0] < 1 || cu.shape[0] > (1 << 30))
      return false;
    const cuda::DeviceScope scope(device_);
    cuda::runtime::DocTileArgs a = args_;
    a.cu = cu.data, a.cu_bits = cu.bits, a.cu_stride = cu.stride[0];
    a.documents = int(cu.shape[0] - 1);
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
    const IndexView& cu = mask.cu_seqlens_q;
    if (bwd_.row < 0 || !cu.present() || mask.cu_seqlens_k.present() || cu.ndim != 1 || cu.shape[0] < 1) return false;
    const cuda::DeviceScope scope(device_);
    if (!cuda::TileBackward::refusal(problem_, q, k, v, o, lse, dout, dq, dk, dv).empty()) return false;
    cuda::runtime::DocTileArgs a = args_;  // key-major: "query tiles" are the key tiles, block_m the 64-row query tile
    a.block_m = 64, a.block_n = 128;
    a.q_tiles = int(bwd_.k_tiles);
    a.cu = cu.data, a.cu_bits = cu.bits, a.cu_stride = cu.stride[0];
    a.documents = int(cu.shape[0] - 1);
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
  int64_t capacity_ = 0;
  std::unique_ptr<DevicePlan> plan_;
  cuda::runtime::DocTileArgs args_;
  KeyMajor bwd_;
};

// The fused forward's launches of the nb x nh lists of `plan` (each list's row offsets: its slice of the plan's).
std::vector<FusedFwd::Params> list_launches(const DevicePlan& plan, const Problem& pr, int64_t nb, int64_t nh,
                                            const TensorView& q, const TensorView& k, const TensorView& v,
                                            const TensorView& o, const TensorView& lse, const char* what) {
  std::vector<FusedFwd::Params> launches;
  const int64_t rows = plan.host().q_tiles + 1;
  for (int64_t l = 0; l < nb * nh; ++l) {
    const ListViews w = list_views(pr, nb, nh, l, {q, o}, {k, v}, lse);
    FusedFwd::Params params;
    const auto st = FusedFwd::can_implement(
        FusedFwd::Arguments{w.p, w.q_like[0], w.k_like[0], w.k_like[1], w.q_like[1], w.lse}, plan, &params);
    if (!st.ok) throw Error(std::string(what) + ": " + st.reason);
    params.kernel.row_offsets = plan.row_offsets() + l * rows;
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

// Block masks: one list a (batch, head) of the mask, written by one kernel; the fused forward launched once a list on
// that list's batch and head (all of them where the mask broadcasts over them: one launch for a [1, 1, NQ] mask).
class BlockRunner final : public DeviceMaskRunner {
 public:
  // block: 128 (the backward too) or 64 (the forward on 64x64 tiles; the backward on the host path).
  BlockRunner(const Problem& pr, int device, bool band, int lo, int hi, int block)
      : problem_(pr), device_(device),
        bwd_(pr, device, pr.batch * pr.q_heads,
             pr.batch * pr.q_heads * ((pr.q_len + 63) / 64) * ((pr.kv_len + 127) / 128), false, block == 128) {
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
    // Heads of one kv-head group sum into its dK and dV inside one launch: per-head lists need groups of one.
    if (nh > 1 && pr.q_heads != pr.kv_heads) return false;
    const cuda::DeviceScope scope(device_);
    const std::vector<ListViews> views = backward_lists(pr, nb, nh, q, k, v, o, lse, dout, dq, dk, dv);
    if (views.empty()) return false;
    a.block_m = 64;  // the backward's query tiles; the mask's blocks stay 128 x 128
    a.row_offsets = bwd_.offsets.get<int64_t>();
    a.entries = bwd_.entries.get<int>();
    a.list_capacity = bwd_.q_tiles * bwd_.k_tiles;
    SPATTN_CUDA_CHECK(cudaError_t(cuda::runtime::launch_block_key_tiles(a, args_.q_tiles, stream)));
    bwd_.launch_all(views, stream);
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
    SPATTN_CUDA_CHECK(cudaError_t(cuda::runtime::launch_block_tiles(a, stream)));
    for (const FusedFwd::Params& params : launches) FusedFwd::run(params, static_cast<cudaStream_t>(stream));
    return true;
  }
  std::string kernel() const override { return kKernels[plan_->kernel_row()].name; }
  std::string explain() const override {
    std::ostringstream s;
    s << "device tile lists of block masks (" << args_.block_m << "x" << args_.block_n
      << " blocks and tiles, one list a (batch, head) of the mask, partial "
         "blocks "
      << (args_.band ? "banded " + std::to_string(args_.lo) + ".." + std::to_string(args_.hi) : std::string("whole"))
      << ", written at each call), kernel " << kernel() << ", a launch a list";
    return s.str();
  }

 private:
  Problem problem_;
  int device_;
  std::unique_ptr<DevicePlan> plan_;
  cuda::runtime::BlockTileArgs args_;
  KeyMajor bwd_;
};

// Top-k keys: every tile's bitmask set by the pairs on the device (a list a batch element, the heads sharing it), the
// flagged tiles listed; the fused forward a launch a list; the backward from transposed bitmasks set likewise.
class TopkRunner final : public DeviceMaskRunner {
 public:
  TopkRunner(const Problem& pr, int device, int64_t K, bool band, int lo, int hi)
      : problem_(pr), device_(device), topk_(K),
        bwd_(pr, device, pr.batch, pr.batch * ((pr.kv_len + 127) / 128) * ((pr.q_len + 63) / 64), true) {
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

  // The call's indices into a copy of args_ (masks and lists unset); false where the device path does not take them.
  bool read_mask(const RuntimeMask& mask, cuda::runtime::TopkTileArgs& a) const {
    const IndexView& t = mask.topk_indices;
    const Problem& pr = problem_;
    if (!t.present() || (t.ndim != 3 && !(t.ndim == 4 && t.shape[2] == 1)) || t.shape[0] != pr.batch ||
        t.shape[1] != pr.q_len || t.shape[size_t(t.ndim - 1)] != topk_)
      return false;
    a = args_;
    a.idx = t.data, a.idx_bits = t.bits;
    a.idx_s[0] = t.stride[0], a.idx_s[1] = t.stride[1], a.idx_s[2] = t.stride[size_t(t.ndim - 1)];
    return true;
  }

  bool forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView& lse, const RuntimeMask& mask, Stream stream) const override {
    cuda::runtime::TopkTileArgs a;
    if (!read_mask(mask, a)) return false;
    const cuda::DeviceScope scope(device_);
    const std::vector<FusedFwd::Params> launches =
        list_launches(*plan_, problem_, problem_.batch, 1, q, k, v, o, lse, "run-time top-k keys");
    a.masks = const_cast<unsigned long long*>(plan_->masks());
    a.flags = flags_.get<unsigned char>();
    a.row_offsets = const_cast<int64_t*>(plan_->row_offsets());
    a.entries = const_cast<int*>(reinterpret_cast<const int*>(plan_->entries()));
    SPATTN_CUDA_CHECK(cudaError_t(cuda::runtime::launch_topk_tiles(a, stream)));
    for (const FusedFwd::Params& params : launches) FusedFwd::run(params, static_cast<cudaStream_t>(stream));
    return true;
  }

  bool backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, const RuntimeMask& mask, Stream stream) const override {
    cuda::runtime::TopkTileArgs a;
    if (bwd_.row < 0 || !read_mask(mask, a)) return false;
    const cuda::DeviceScope scope(device_);
    const std::vector<ListViews> views =
        backward_lists(problem_, problem_.batch, 1, q, k, v, o, lse, dout, dq, dk, dv);
    if (views.empty()) return false;
    a.key_masks = bwd_.masks.get<unsigned long long>();
    a.key_flags = key_flags_.get<unsigned char>();
    a.key_offsets = bwd_.offsets.get<int64_t>();
    a.key_entries = bwd_.entries.get<int>();
    SPATTN_CUDA_CHECK(cudaError_t(cuda::runtime::launch_topk_tiles(a, stream)));
    bwd_.launch_all(views, stream);
    return true;
  }
  std::string backward_kernel() const override { return bwd_.name(); }
  std::string kernel() const override { return kKernels[plan_->kernel_row()].name; }
  std::string explain() const override {
    return "device bitmasks of top-" + std::to_string(topk_) + " keys (every 128 x 128 tile's bits set by the pairs, " +
           "the tiles holding any listed as entries, a list a batch element), kernel " + kernel() + "; backward " +
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
  if (pr.dtype != DType::bf16 && pr.dtype != DType::f16) return refuse("dtype " + std::string(dtype_name(pr.dtype)));
  if ((pr.head_dim != 64 && pr.head_dim != 128) || pr.dv() != pr.head_dim) return refuse("head dim");
  int lo = 0, hi = 0;
  if (!spec_band(layout, pr, &lo, &hi, &r)) return refuse(r);
  if (layout.kind == MaskKind::topk) {
    const int64_t tiles = pr.batch * ((pr.q_len + 127) / 128) * ((pr.kv_len + 127) / 128);
    if (tiles * 2 * 2048 > (int64_t(1) << 31))  // forward and transposed bitmasks, 2 KiB a tile each
      return refuse("its bitmasks (" + std::to_string(tiles * 4096 >> 20) + " MiB) are past 2 GiB");
    if (!layout.spec.empty() && int64_t(hi) - lo > 8192) return refuse("a spec band wider than 8192 keys");
    return std::make_unique<TopkRunner>(pr, device, layout.topk, !layout.spec.empty(), lo, hi);
  }
  if (layout.kind == MaskKind::blocks) {
    const int64_t b = layout.q_block;
    if (b != layout.k_block || (b != 128 && b != 64)) return refuse("blocks other than 128 x 128 or 64 x 64");
    const int64_t bytes = pr.batch * pr.q_heads * ((pr.q_len + b - 1) / b) * ((pr.kv_len + b - 1) / b) * 16;
    if (bytes > (int64_t(1) << 30)) return refuse("its list capacity (" + std::to_string(bytes >> 20) + " MiB) is past 1 GiB");
    return std::make_unique<BlockRunner>(pr, device, !layout.spec.empty(), lo, hi, int(b));
  }
  if (pr.q_len != pr.kv_len) return refuse("documents of queries and keys of different lengths");
  const int64_t k_tiles = (pr.kv_len + 127) / 128;
  const int64_t per_row = cuda::runtime::document_tiles_per_row(128, 128, lo, hi, k_tiles);
  const int64_t mask_bytes = (pr.q_len + 127) / 128 * per_row * 128 * 128 / 8;
  if (mask_bytes > (int64_t(1) << 30))
    return refuse("its bitmask capacity (" + std::to_string(mask_bytes >> 20) + " MiB) is past 1 GiB");
  return std::make_unique<DocumentRunner>(pr, device, lo, hi, per_row);
}

}  // namespace spattn::plan
