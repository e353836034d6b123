// cuda/fused/fused_fwd.cu — host side of the fused kernel: plan upload, checks, parameters, dispatch.
#include "cuda/fused/fused_fwd.hpp"
#include "plan/kernels.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda/common/check.hpp"
#include "cuda/common/device.hpp"
#include "cuda/common/tmap.hpp"
#include "cuda/fused/random_rows.hpp"
#include "cuda/fused/strip_masks.hpp"

namespace spattn::cuda::fused {

namespace {
// The tensor maps of q, k and v for the TMA and band kernels (K/V boxes of `kv_rows` rows: the key tile, or the
// band kernel's 64-key chunk); false where the driver's rules refuse one (strides, alignment).
bool encode_qkv(const FusedFwd::Arguments& a, int q_rows, int kv_rows, FusedParams& k) {
  return encode_tmap(k.tmap_q, a.q, q_rows) && encode_tmap(k.tmap_k, a.k, kv_rows) && encode_tmap(k.tmap_v, a.v, kv_rows);
}
}  // namespace

// FusedParams::kb of a mapped plan's key boxes (zero where unmapped).
static void set_key_boxes(const plan::BlockPlan& hp, FusedParams& k) {
  k.kb = KeyBoxes{};
  k.strips = hp.key_strips() ? 1 : 0;
  k.strip_sx = hp.strip_sx;
  k.strip_sy = hp.strip_sy;
  if (!hp.mapped() || hp.key_strips()) return;
  const plan::GridTiling& t = hp.k_tiling;
  int side[3];
  int64_t stride[3];
  for (int a = 0; a < 3; ++a) {
    side[a] = t.box.side[size_t(a)];
    stride[a] = t.token_stride(a);
    if (side[a] < 1 || (side[a] & (side[a] - 1)) != 0 || side[a] > 128)
      throw Error("fused kernel: key box sides must be powers of two up to 128, got " + t.box.str(3));
  }
  k.kb = key_boxes(side, stride);
}

DevicePlan::DevicePlan(plan::BlockPlan host, int kernel_row) : host_(std::move(host)), kernel_row_(kernel_row) {
  const auto t0 = std::chrono::steady_clock::now();
  device_ = current_device();
  shape_ = plan::list_shape(host_.row_offsets, host_.entries, host_.k_tiles,
                            plan::section_groups(false, host_.perm_d));
  static_assert(sizeof(plan::TileEntry) == sizeof(int4), "TileEntry is uploaded as int4");
  // 64x128 plans: mark partial tiles whose kept keys lie in one 64-key half (kHalfShift, fused_params.hpp).
  std::vector<plan::TileEntry> up(host_.entries);
  if (host_.block_m == 64 && host_.block_n == 128) {
    for (int64_t qt = 0; qt < host_.q_tiles; ++qt)
      for (int64_t i = host_.row_offsets[size_t(qt)]; i < host_.row_offsets[size_t(qt) + 1]; ++i) {
        const int bits = plan::entry_halves(host_, qt, i);
        if (bits == 1 || bits == 2) {
          up[size_t(i)].kt |= int32_t(unsigned(bits) << kHalfShift);
          ++narrow_;
        }
      }
  }
  // Mapped plans: each entry's key box as its last two words (base token, box_limits of its extents), from which the
  // kernels compute their rows' tokens (key_boxes.hpp); mapped plans have no band entries, whose words those are.
  // Strip plans: each entry's strip (base token, strip_pack of its width and count).
  if (host_.key_strips()) {
    if (host_.block_m != 64 || host_.block_n != 64) throw Error("fused kernel: a key-strip plan must have 64x64 tiles");
    for (plan::TileEntry& e : up) {
      if (e.mask == plan::kBand) throw Error("fused kernel: a key-strip plan with a band entry");
      const plan::KeyStrip& st = host_.strips[size_t(e.kt)];
      if (st.width < 1 || st.width > 64 || st.count < 1 || st.count > 64)
        throw Error("fused kernel: a key strip of width " + std::to_string(st.width) + " and " + std::to_string(st.count) + " slots");
      e.lo = st.base;
      e.hi = strip_pack(st.width, st.count);
    }
  } else if (host_.mapped() && !up.empty()) {
    const std::vector<plan::GridTiling::BoxRows> boxes = host_.k_tiling.boxes();
    if (int64_t(boxes.size()) != host_.k_tiles) throw Error("fused kernel: the key tiling's boxes are not the plan's key tiles");
    for (plan::TileEntry& e : up) {
      if (e.mask == plan::kBand) throw Error("fused kernel: a mapped plan with a band entry");
      const plan::GridTiling::BoxRows& b = boxes[size_t(e.kt & kKtMask)];
      e.lo = int32_t(b.base);
      e.hi = box_limits(b.extent[0], b.extent[1], b.extent[2]);
    }
  }
  // Plans the band kernel runs may have split work items: workspace for one part per SM.
  size_t split_ws_floats = 0;
  if (kernel_row_ >= 0 && plan::is_band(plan::kKernels[kernel_row_].kind)) {
    const plan::KernelConfig& c = plan::kKernels[kernel_row_];
    split_cap_ = device_info(device_).sms;
    split_ws_floats = size_t(split_part_floats(c.block_m, c.head_dim));
  }
  // One block of the device pool (cuda/common/pool.hpp) holds every array, each at a 256-byte boundary: the small
  // ones and the zeroed work counters staged on the host and copied at once, then the bitmasks (a random plan's
  // are tens of MB: copied as they are, no staged copy), then the split workspace (not copied). So a plan makes
  // one pool request and one or two copies, no cudaMalloc once the pool holds a block of its size.
  struct Seg {
    const void* src;  // null: zeros
    size_t bytes, at = 0;
  };
  static_assert(sizeof(unsigned long long) == sizeof(uint64_t));
  Seg segs[] = {{host_.row_offsets.data(), host_.row_offsets.size() * sizeof(int64_t)},
                {up.data(), up.size() * sizeof(int4)},
                {host_.order.data(), host_.order.size() * sizeof(int32_t)},
                {host_.q_map.data(), host_.q_map.size() * sizeof(int32_t)},  // empty where the plan is not mapped
                {host_.k_map.data(), host_.k_map.size() * sizeof(int32_t)},
                {nullptr, counter_ints() * sizeof(int)},
                {host_.grid_windows.data(), host_.grid_windows.size() * sizeof(int32_t)},  // (strip masks drawn here)
                {host_.masks.data(), size_t(host_.masks_drawn() ? host_.nentries() * host_.words_per_mask()
                                                                : int64_t(host_.masks.size())) * sizeof(uint64_t)},
                {nullptr, size_t(split_cap_) * split_ws_floats * sizeof(float)}};
  constexpr size_t kStaged = 7;  // segs[0, kStaged) staged; then the masks; then the workspace
  auto align = [](size_t b) { return (b + 255) / 256 * 256; };
  size_t total = 0;
  for (Seg& g : segs) g.at = total, total += align(g.bytes);
  block_ = DeviceBuffer(total, "a fused plan's arrays");
  char* base = block_.get<char>();
  const size_t staged = segs[kStaged].at;
  std::vector<char> stage(staged, 0);
  for (size_t i = 0; i < kStaged; ++i)
    if (segs[i].src && segs[i].bytes) std::memcpy(stage.data() + segs[i].at, segs[i].src, segs[i].bytes);
  SPATTN_CUDA_CHECK(cudaMemcpy(base, stage.data(), staged, cudaMemcpyHostToDevice));
  auto at = [&](size_t i) -> char* { return segs[i].bytes ? base + segs[i].at : nullptr; };
  row_offsets_ = reinterpret_cast<int64_t*>(at(0));
  entries_ = reinterpret_cast<int4*>(at(1));
  order_ = reinterpret_cast<int32_t*>(at(2));
  q_map_ = reinterpret_cast<int32_t*>(at(3));
  k_map_ = reinterpret_cast<int32_t*>(at(4));
  work_counter_ = reinterpret_cast<int*>(at(5));
  const auto* grid_windows = reinterpret_cast<const int32_t*>(at(6));
  masks_ = reinterpret_cast<unsigned long long*>(at(7));
  split_ws_ = reinterpret_cast<float*>(at(8));
  if (masks_ && host_.masks_drawn()) {
    // Drawn here instead (BlockPlan::drawn, grid_windows), from the arrays just copied; waited for, as the copies are:
    // the plan is ready for any stream.
    if (host_.drawn.r > 0)
      SPATTN_CUDA_CHECK(cudaError_t(launch_random_tile_masks(host_.drawn.r, host_.drawn.seed, host_.q_len, host_.k_len,
                                                             host_.block_m, host_.block_n, masks_, nullptr)));
    else
      SPATTN_CUDA_CHECK(cudaError_t(launch_grid_strip_masks(host_.q_tiles, host_.nentries(), row_offsets_,
                                                            reinterpret_cast<const int32_t*>(entries_), q_map_, grid_windows,
                                                            host_.q_tiling.dims.data(), host_.strip_sx, host_.strip_sy,
                                                            masks_, nullptr)));
    SPATTN_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  } else if (masks_) {
    SPATTN_CUDA_CHECK(cudaMemcpy(masks_, segs[kStaged].src, segs[kStaged].bytes, cudaMemcpyHostToDevice));
  }
  upload_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

DevicePlan::~DevicePlan() = default;

Status FusedFwd::can_implement(const Arguments& a, const DevicePlan& plan, Params* params) {
  // The views' shapes against the problem are checked once a call at the API boundary (Plan::forward); what only
  // this layer knows is checked here: the problem against the plan and the kernel, the strides, the alignment, the
  // device and the tensor maps.
  const Problem& pr = a.problem;
  if (pr.dtype != DType::bf16 && pr.dtype != DType::f16)
    return Status::fail("fused kernel: dtype must be bf16 or fp16, got " + std::string(dtype_name(pr.dtype)));
  if (a.split < -1 || a.split > 4)
    return Status::fail("fused kernel: split must be -1 (chosen), 0 (never), 1 (slabs) or 2-4 parts, got " +
                        std::to_string(a.split));
  if (pr.head_dim != 64 && pr.head_dim != 128)
    return Status::fail("fused kernel: head dim must be 64 or 128, got " + std::to_string(pr.head_dim));
  if (pr.dv() != pr.head_dim)
    return Status::fail("fused kernel: value dim (" + std::to_string(pr.dv()) + ") must equal head dim (" +
                        std::to_string(pr.head_dim) + ")");
  const plan::BlockPlan& hp = plan.host();
  if (hp.q_len != pr.q_len || hp.k_len != pr.kv_len)
    return Status::fail("fused kernel: plan was built for lengths " + std::to_string(hp.q_len) + "x" +
                        std::to_string(hp.k_len) + ", problem has " + std::to_string(pr.q_len) + "x" +
                        std::to_string(pr.kv_len));
  const int row = plan.kernel_row();
  if (row < 0 || plan::kKernels[row].head_dim != pr.head_dim)
    return Status::fail("fused kernel: no kernel for tiles " + std::to_string(hp.block_m) + "x" + std::to_string(hp.block_n) +
                        " at head dim " + std::to_string(pr.head_dim) +
                        (row >= 0 ? std::string(" (plan chose ") + plan::kKernels[row].name + ")" : std::string()));
  if (int64_t(hp.perm_d) * std::max(hp.q_group, hp.k_group) >= (int64_t(1) << 31) - 256)  // mapped: the maps' lengths
    return Status::fail("fused kernel: lengths must stay below 2^31");
  if (hp.mapped() && (plan::kKernels[row].kind != plan::KernelKind::sm90_cp && plan::kKernels[row].kind != plan::KernelKind::sm80_mma))
    return Status::fail(std::string("fused kernel: a mapped plan (tile map) runs on the cp.async and mma.sync kernels only, not ") +
                        plan::kKernels[row].name);
  if (hp.key_strips() && (plan::kKernels[row].block_m != 64 || plan::kKernels[row].block_n != 64))
    return Status::fail(std::string("fused kernel: a key-strip plan (tile_map 2) runs on the 64x64 cp.async and mma.sync kernels only, not ") +
                        plan::kKernels[row].name);
  if (hp.q_tiles * pr.batch * pr.q_heads >= (int64_t(1) << 31))
    return Status::fail("fused kernel: too many query tiles x heads for one grid");
  const TensorView* views[4] = {&a.q, &a.k, &a.v, &a.o};
  const char* names[4] = {"q", "k", "v", "o"};
  for (int i = 0; i < 4; ++i) {
    const TensorView& t = *views[i];
    if (t.dtype != pr.dtype)
      return Status::fail(std::string("fused kernel: ") + names[i] + " has dtype " + std::string(dtype_name(t.dtype)) +
                          ", problem has " + std::string(dtype_name(pr.dtype)));
    if (t.stride[3] != 1) return Status::fail(std::string("fused kernel: ") + names[i] + " must have a contiguous head dim");
    const int64_t align = i < 3 ? 8 : 2;  // elements: 16-byte cp.async rows, 4-byte output stores
    if (reinterpret_cast<uintptr_t>(t.data) % (2 * align) != 0 || t.stride[0] % align || t.stride[1] % align ||
        t.stride[2] % align)
      return Status::fail(std::string("fused kernel: ") + names[i] + " must be " + std::to_string(2 * align) +
                          "-byte aligned, pointer and strides");
    // Mapped plans gather q, k and v rows with 32-bit token strides (MappedRows::copy).
    if (i < 3 && hp.mapped() && 2 * t.stride[1] >= (int64_t(1) << 31))
      return Status::fail(std::string("fused kernel: ") + names[i] + "'s token stride (" + std::to_string(t.stride[1]) +
                          " elements) must stay below 2^30 elements for a tile-mapped plan");
  }
  if (a.lse.data) {
    if (a.lse.dtype != DType::f32) return Status::fail("fused kernel: lse must be fp32");
    if (a.lse.stride[2] != 1) return Status::fail("fused kernel: lse must be contiguous along the query axis");
  }
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return Status::fail("fused kernel: no CUDA device");
  if (dev != plan.device())
    return Status::fail("fused kernel: plan lives on device " + std::to_string(plan.device()) + ", current device is " +
                        std::to_string(dev));
  DeviceInfo info;
  try {
    info = device_info(dev);
  } catch (const Error& e) {
    return Status::fail(e.what());
  }
  if (info.cc < 80)
    return Status::fail("fused kernel: needs compute capability 8.0 or newer, device has " + std::to_string(info.cc));
  if (plan::is_sm90(plan::kKernels[row].kind) && !info.sm90a())
    return Status::fail(std::string("fused kernel: ") + plan::kKernels[row].name +
                        " needs an sm_90a device (compute capability 9.0), device has " + std::to_string(info.cc));
  if (hp.block_m == 192 || params) {
    // The launch parameters (tensor maps encoded once, here, when the caller asks for them).
    Params p;
    try {
      p = to_params(a, plan);
    } catch (const Error& e) {
      return Status::fail(e.what());
    }
    if (p.kernel_row < 0)
      return Status::fail("fused kernel: 192x128 tiles: the driver refused a tensor map of q, k or v (strides)");
    if (params) *params = p;
  }
  return {};
}

FusedFwd::Params FusedFwd::to_params(const Arguments& a, const DevicePlan& plan) {
  const Problem& pr = a.problem;
  const plan::BlockPlan& hp = plan.host();
  Params out;
  FusedParams& k = out.kernel;
  k.q = a.q.data;
  k.k = a.k.data;
  k.v = a.v.data;
  k.o = a.o.data;
  k.lse = static_cast<float*>(a.lse.data);
  k.q_sb = a.q.stride[0], k.q_sl = a.q.stride[1], k.q_sh = a.q.stride[2];
  k.k_sb = a.k.stride[0], k.k_sl = a.k.stride[1], k.k_sh = a.k.stride[2];
  k.v_sb = a.v.stride[0], k.v_sl = a.v.stride[1], k.v_sh = a.v.stride[2];
  k.o_sb = a.o.stride[0], k.o_sl = a.o.stride[1], k.o_sh = a.o.stride[2];
  k.lse_sb = a.lse.data ? a.lse.stride[0] : 0;
  k.lse_sh = a.lse.data ? a.lse.stride[1] : 0;
  k.batch = int(pr.batch);
  k.q_heads = int(pr.q_heads);
  k.group = int(pr.q_heads / pr.kv_heads);
  k.q_len = int(pr.q_len);
  k.k_len = int(pr.kv_len);
  k.perm_d = hp.perm_d;
  k.q_group = int(hp.q_group);
  k.k_group = int(hp.k_group);
  k.q_map = plan.q_map();
  k.k_map = plan.k_map();
  set_key_boxes(hp, k);
  const double scale = pr.softmax_scale();
  k.scale = float(scale);
  k.scale_log2 = float(scale * 1.4426950408889634);
  k.row_offsets = plan.row_offsets();
  k.entries = plan.entries();
  k.masks = plan.masks();
  k.order = plan.order();
  k.work_counter = plan.work_counter();
  k.q_tiles = int(hp.q_tiles);
  // Head sections of the work order: a kv head's K and V, read by its group's q heads.
  k.head_section = plan::head_section(pr.kv_len * (pr.head_dim + pr.dv()) * int64_t(dtype_size(pr.dtype)),
                                      pr.batch * pr.q_heads, k.group, device_info(plan.device()).l2_bytes,
                                      plan.list_shape());
  out.bf16 = pr.dtype == DType::bf16;
  // The plan's row, or where the tensors' strides admit no tensor map, the row that runs without it. The band and
  // TMA kernels store O through o's map (64-row boxes: a slab, a consumer's rows); without it the cp.async kernel
  // of the tile shape runs the plan, or for 192-row tiles, which have none, the TMA kernel's instantiation whose
  // threads store O (launch_ws). They load through q's, k's and v's maps; without them the cp.async kernel of the
  // tile shape runs (192-row tiles: can_implement refuses).
  using plan::KernelKind;
  int row = plan.kernel_row();
  KernelKind kind = plan::kKernels[row].kind;
  const bool tma_rows = kind == KernelKind::sm90_tma || plan::is_band(kind);
  out.o_map = tma_rows && encode_tmap(k.tmap_o, a.o, 64);
  if (tma_rows && !out.o_map) {
    kind = hp.block_m == 192 ? KernelKind::sm90_tma : KernelKind::sm90_cp;
    row = plan::find_kernel(kind, hp.block_m, hp.block_n, int(pr.head_dim));
  }
  if ((kind == KernelKind::sm90_tma || plan::is_band(kind)) &&
      !encode_qkv(a, hp.block_m, plan::is_band(kind) ? 64 : hp.block_n, k)) {
    row = plan::find_kernel(KernelKind::sm90_cp, hp.block_m, hp.block_n, int(pr.head_dim));
    kind = KernelKind::sm90_cp;
  }
  out.kernel_row = row;
  k.band_lo = hp.band_lo;
  k.band_hi = hp.band_hi;
  k.band_shifted = hp.band && hp.band_shifted ? 1 : 0;
  k.band_prefix = hp.band ? hp.band_prefix : 0;
  out.grid = unsigned(hp.q_tiles * pr.batch * pr.q_heads);
  k.persistent = a.persistent;
  k.split_first = int(out.grid);
  k.split_k = 1;
  k.split_slabs = 0;
  k.trace = nullptr;
  k.merge_out = 0;
  k.split_ws = plan.split_ws();
  k.split_count = plan.work_counter() + 2;
  if ((kind == KernelKind::sm90_tma || plan::is_band(kind)) && k.persistent) {
    const unsigned sms = unsigned(device_info(plan.device()).sms);
    if (plan::is_band(kind)) {
      const plan::SplitChoice c = plan::choose_split(hp, pr.batch * pr.q_heads, int(sms), a.split, plan.split_cap());
      k.split_first = c.first, k.split_k = c.parts, k.split_slabs = c.slabs;
    }
    const int64_t work = int64_t(k.split_first) + (int64_t(out.grid) - k.split_first) * k.split_k;
    out.grid = unsigned(std::min<int64_t>(work, sms));
  }
  return out;
}

#ifdef SPATTN_TRACE
// SPATTN_TRACE builds: with SPATTN_TRACE_FILE set, a band-kernel launch outside graph capture records its events
// (FusedParams::trace) and writes them to that file (overwritten: the last such launch), as the count (u64) then
// 4 u64 an event.
static bool traced_run(const LaunchParams& p, cudaStream_t stream) {
  static const char* file = std::getenv("SPATTN_TRACE_FILE");
  if (file == nullptr || p.kernel_row < 0 || !plan::is_band(plan::kKernels[p.kernel_row].kind)) return false;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &st) != cudaSuccess || st != cudaStreamCaptureStatusNone) return false;
  constexpr size_t kEvents = kTraceEvents;
  static unsigned long long* buf = nullptr;
  if (buf == nullptr) SPATTN_CUDA_CHECK(cudaMalloc(&buf, (4 + 4 * kEvents) * 8));
  SPATTN_CUDA_CHECK(cudaMemsetAsync(buf, 0, 32, stream));
  LaunchParams q = p;
  q.kernel.trace = buf;
  SPATTN_CUDA_CHECK(cudaError_t(launch_sm90(q, stream)));
  SPATTN_CUDA_CHECK(cudaStreamSynchronize(stream));
  unsigned long long n = 0;
  SPATTN_CUDA_CHECK(cudaMemcpy(&n, buf, 8, cudaMemcpyDeviceToHost));
  n = std::min<unsigned long long>(n & 0xffffffffu, kEvents);
  std::vector<unsigned long long> ev(4 * n);
  SPATTN_CUDA_CHECK(cudaMemcpy(ev.data(), buf + 4, ev.size() * 8, cudaMemcpyDeviceToHost));
  if (FILE* f = std::fopen(file, "wb")) {
    std::fwrite(&n, 8, 1, f);
    std::fwrite(ev.data(), 8, ev.size(), f);
    std::fclose(f);
  }
  return true;
}
#endif

void FusedFwd::run(const Params& p, cudaStream_t stream) {
  if (p.grid == 0) return;
#ifdef SPATTN_TRACE
  if (traced_run(p, stream)) return;
#endif
  if (p.kernel_row < 0 || p.kernel_row >= plan::kNumKernels) throw Error("fused kernel: no kernel-table row to launch");
  const int e = plan::is_sm90(plan::kKernels[p.kernel_row].kind) ? launch_sm90(p, stream) : launch_sm80(p, stream);
  if (e == int(cudaErrorInvalidConfiguration)) throw Error("fused kernel: no instantiation for " + kernel_name(p));
  check(cudaError_t(e), ("launch of " + kernel_name(p)).c_str(), __FILE__, __LINE__);
}

std::string FusedFwd::kernel_name(const Params& p) {
  return std::string(p.kernel_row >= 0 ? plan::kKernels[p.kernel_row].name : "none") + (p.bf16 ? "_bf16" : "_fp16");
}

}  // namespace spattn::cuda::fused
