// cuda/runtime/device_runner.cpp — the GPU path of run-time masks (plan/runtime_mask.hpp, DeviceMaskRunner): a fused
// plan whose arrays are sized once for the shapes (a skeleton BlockPlan uploaded as a DevicePlan) and rewritten on the
// device at every call from the mask tensors (cuda/runtime/document_tiles.hpp), then the fused forward kernel chosen
// for the skeleton. Two small kernels and the forward a call, no synchronisation, no allocation: CUDA-graph
// capturable, and a replay reads the mask tensors' new contents.
#include <cuda_runtime.h>

#include <numeric>
#include <sstream>

#include "cuda/common/check.hpp"
#include "cuda/common/device.hpp"
#include "cuda/fused/fused_attention.hpp"
#include "cuda/fused/fused_fwd.hpp"
#include "cuda/runtime/document_tiles.hpp"
#include "plan/kernels.hpp"
#include "plan/runtime_mask.hpp"

namespace spattn::plan {
namespace {

using cuda::fused::DevicePlan;
using cuda::fused::FusedFwd;

// The band of a document's static spec (none: every pair), as kernel offsets clamped to [-(q_len + 1), k_len + 1].
bool document_band(const MaskLayout& layout, const Problem& pr, int* lo, int* hi, std::string* why) {
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

class DocumentRunner final : public DeviceMaskRunner {
 public:
  DocumentRunner(const Problem& pr, int device, int lo, int hi, int64_t per_row) : problem_(pr), device_(device) {
    const cuda::DeviceScope scope(device);
    BlockPlan hp;  // the skeleton: sizes and capacities; every list is written on the device at each call
    hp.block_m = 128, hp.block_n = 128;
    hp.q_len = pr.q_len, hp.k_len = pr.kv_len;
    hp.q_group = pr.q_len, hp.k_group = pr.kv_len;
    hp.q_tiles = (pr.q_len + 127) / 128, hp.k_tiles = (pr.kv_len + 127) / 128;
    hp.row_offsets.assign(size_t(hp.q_tiles + 1), 0);
    capacity_ = hp.q_tiles * per_row;
    hp.entries.assign(size_t(capacity_), TileEntry{0, kFull, 0, 0});
    hp.masks.resize(size_t(capacity_ * hp.words_per_mask()));  // left uninitialised: written before they are read
    hp.order.resize(size_t(hp.q_tiles));
    std::iota(hp.order.begin(), hp.order.end(), 0);
    const int row = FusedFwd::choose_kernel(hp, pr.head_dim, cuda::device_info(device).cc, FusedOptions{});
    if (row < 0) throw Error("run-time documents: no fused kernel for 128x128 tiles at head dim " + std::to_string(pr.head_dim));
    plan_ = std::make_unique<DevicePlan>(std::move(hp), row);
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
  std::string kernel() const override { return kKernels[plan_->kernel_row()].name; }
  std::string explain() const override {
    std::ostringstream s;
    s << "device tile lists of packed documents (128x128 tiles, band " << args_.lo << ".." << args_.hi << ", up to "
      << capacity_ << " entries and bitmasks, written at each call), kernel " << kernel();
    return s.str();
  }

 private:
  Problem problem_;
  int device_;
  int64_t capacity_ = 0;
  std::unique_ptr<DevicePlan> plan_;
  cuda::runtime::DocTileArgs args_;
};

}  // namespace

std::unique_ptr<DeviceMaskRunner> make_device_mask_runner(const MaskLayout& layout, const Problem& pr, int device,
                                                          std::string* why) {
  std::string r;
  auto refuse = [&](std::string reason) -> std::unique_ptr<DeviceMaskRunner> {
    if (why) *why = std::move(reason);
    return nullptr;
  };
  if (layout.kind != MaskKind::documents) return refuse("the device path takes packed documents only, so far");
  if (pr.q_len != pr.kv_len) return refuse("documents of queries and keys of different lengths");
  if (pr.dtype != DType::bf16 && pr.dtype != DType::f16) return refuse("dtype " + std::string(dtype_name(pr.dtype)));
  if ((pr.head_dim != 64 && pr.head_dim != 128) || pr.dv() != pr.head_dim) return refuse("head dim");
  int lo = 0, hi = 0;
  if (!document_band(layout, pr, &lo, &hi, &r)) return refuse(r);
  const int64_t k_tiles = (pr.kv_len + 127) / 128;
  const int64_t per_row = cuda::runtime::document_tiles_per_row(128, 128, lo, hi, k_tiles);
  const int64_t mask_bytes = (pr.q_len + 127) / 128 * per_row * 128 * 128 / 8;
  if (mask_bytes > (int64_t(1) << 30))
    return refuse("its bitmask capacity (" + std::to_string(mask_bytes >> 20) + " MiB) is past 1 GiB");
  return std::make_unique<DocumentRunner>(pr, device, lo, hi, per_row);
}

}  // namespace spattn::plan
