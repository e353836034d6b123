// plan/runtime_mask.hpp — a run-time mask (spattn/runtime_mask.hpp) on the host: its tensors copied into one call's
// record, validated, and read two ways that share no code: the predicate of the semantics (the reference's oracle) and
// the kept keys of each row as an explicit pattern (what the engines run).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "spattn/runtime_mask.hpp"

namespace spattn::plan {

// Copies `bytes` from device memory of `device` to the host, in order after the work on `stream` (which it waits
// for). Defined by the CUDA engine (cuda/runtime/host_copy.cpp); builds without CUDA throw Error.
void device_to_host(void* dst, const void* src, int64_t bytes, int device, Stream stream);

// The GPU path of run-time masks (cuda/runtime/): tile lists written on the device from the mask tensors at every call
// into fixed-capacity arrays sized here, feeding the fused forward kernels unchanged; no host synchronisation. Today:
// packed documents (cu_seqlens_q, and cu_seqlens_k with up to one document a query tile), block masks of 128 or 64
// square blocks (a launch a (batch, head) list of the mask) and top-k keys (tile bitmasks set by the pairs; indices
// per kv or query head a head at a time), each with no spec or a band spec (causal, local, their intersections); their
// backward from key-major lists written on the device (the sm_90a tile backward; per-query-head lists under GQA through
// per-head dK / dV partials summed over the kv group), except 64-blocks' at head dim 128 (host_cases()).
class DeviceMaskRunner {
 public:
  virtual ~DeviceMaskRunner() = default;
  // Enqueues the forward where this call's mask is one the device path takes (true); false: the caller runs it
  // otherwise (a tensor it does not read, such as cu_seqlens_k).
  virtual bool forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                       const TensorView& lse, const RuntimeMask& mask, Stream stream) const = 0;
  // The backward likewise (false: not taken here; the caller runs it otherwise).
  virtual bool backward(const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                        const TensorView&, const TensorView&, const TensorView&, const TensorView&, const RuntimeMask&,
                        Stream) const {
    return false;
  }
  virtual std::string backward_kernel() const { return ""; }  // the row the last backward here launched
  virtual std::string kernel() const = 0;  // the fused kernel-table row it runs
  virtual std::string explain() const = 0;
  // The calls of its layout it does not take (forward or backward returns false; they run on the host path).
  virtual std::string host_cases() const = 0;
};
// Null, with the reason in *why, where the device path does not take the layout or the problem (or the build has
// no CUDA). Built on `device` (cuda/runtime/device_runner.cpp; the stub: api/runtime_stub.cpp).
std::unique_ptr<DeviceMaskRunner> make_device_mask_runner(const MaskLayout& layout, const Problem& problem, int device,
                                                          std::string* why);

// One call's mask on the host: every tensor as contiguous int64 in its logical shape.
struct HostMask {
  MaskLayout layout;
  Problem problem;
  std::optional<BoundPattern> spec;  // blocks / topk: the static spec bound to (q_len, kv_len)
  // blocks: dims of kv_num_blocks ([nb_b, nb_h, nb_q]) and kv_indices ([.., .., .., nb_k]); full_* likewise (fb_*)
  int64_t nb_b = 0, nb_h = 0, nb_q = 0, nb_k = 0;
  int64_t fb_b = 0, fb_h = 0, fb_q = 0, fb_k = 0;
  bool has_full = false;
  std::vector<int64_t> num, idx, full_num, full_idx;
  int64_t q_blocks() const { return (problem.q_len + layout.q_block - 1) / layout.q_block; }
  int64_t k_blocks() const { return (problem.kv_len + layout.k_block - 1) / layout.k_block; }
  // documents
  std::vector<int64_t> cu_q, cu_k;
  int64_t documents() const { return int64_t(cu_q.size()) - 1; }
  // topk: [B, Lq, tk_h, K]
  int64_t tk_h = 1;
  std::vector<int64_t> topk;
};

// Loads `mask` for `layout` and `problem`: shapes checked (every call, cheap: O(dimensions)), tensors copied (device
// plans: device_to_host on `device` / `stream`; copy false: the shapes only, no tensor read, the vectors empty).
// Throws Error naming the tensor, dimension and both values.
HostMask load_host_mask(const MaskLayout& layout, const Problem& problem, const RuntimeMask& mask, bool on_device,
                        int device, Stream stream, bool copy = true);

// Validates the contents: counts in range, indices in range, no index twice in a row (nor a block both full and
// partial), document boundaries non-decreasing inside [0, L]. Throws Error naming the tensor, its index and value.
void validate(const HostMask& m);

// The semantics straight from their words (spattn/runtime_mask.hpp): whether (q, k) of batch b, query head h is kept.
// For the reference: O(listed entries) a call, documents bound once here.
class MaskPredicate {
 public:
  explicit MaskPredicate(const HostMask& m);
  bool contains(int64_t b, int64_t h, int64_t q, int64_t k) const;

 private:
  const HostMask& m_;
  std::vector<std::optional<BoundPattern>> doc_spec_;  // per document (none: no spec or an empty document)
};

// The kept keys of every row of (b, h) as an explicit pattern (BoundPattern::from_rows), enumerated from the listed
// entries and the spec's rows. (b, h) pairs with the same row_group() have the same rows.
BoundPattern mask_rows(const HostMask& m, int64_t b, int64_t h);
int64_t row_group(const HostMask& m, int64_t b, int64_t h);
// The same from the predicate (every (q, k) tested): the reference's patterns.
BoundPattern predicate_rows(const MaskPredicate& p, const HostMask& m, int64_t b, int64_t h);

}  // namespace spattn::plan
