// spattn/runtime_mask.hpp — sparsity chosen at run time: a plan built once for shapes and block sizes, whose mask
// comes from integer tensors at every call (block masks, packed documents, top-k keys).
//
//   spattn::MaskLayout layout = spattn::MaskLayout::blocks(128, 128, "causal");      // FlexAttention's BlockMask
//   spattn::Plan plan = spattn::make_plan(layout, problem, spattn::Device::cpu());
//   spattn::RuntimeMask mask;
//   mask.kv_num_blocks = spattn::IndexView::of(num.data(), {1, H, nqb});                     // int32 or int64
//   mask.kv_indices = spattn::IndexView::of(idx.data(), {1, H, nqb, nkb});
//   plan.forward(q, k, v, o, lse, mask, stream);
//
// Semantics (the CPU reference computes them straight from these words; docs/RUNTIME_MASKS.md):
//
//   blocks     Query block qb = q / q_block of (batch b, query head h) sees the key blocks listed in
//              kv_indices[b, h, qb, 0 : kv_num_blocks[b, h, qb]] ("partial" blocks) and in
//              full_kv_indices[b, h, qb, 0 : full_kv_num_blocks[b, h, qb]] ("full" blocks, optional). (q, k) is kept
//              iff k / k_block is a full block of q's row, or a partial one and the static spec (bound to
//              (q_len, kv_len); none: every pair) keeps (q, k). FlexAttention's layout: a batch or head dimension of
//              size 1 is broadcast; entries past the count are padding, never read. The count's last dimension may
//              exceed ceil(q_len / q_block) (extra query blocks are ignored).
//   documents  cu_seqlens_q [n + 1] and cu_seqlens_k [n + 1] (k: optional, then the same as q), FlashAttention's
//              varlen layout: document i holds queries [cu_q[i], cu_q[i+1]) and keys [cu_k[i], cu_k[i+1]). (q, k) is
//              kept iff both lie in one document i and the static spec bound to that document's lengths
//              (lq_i x lk_i; none: every pair) keeps (q - cu_q[i], k - cu_k[i]). The spec is evaluated in document
//              coordinates from the top left: `causal` is k <= q there (FlashAttention aligns causal masks of
//              lq_i != lk_i at the bottom right; with equal lengths the two agree). Tokens in no document keep
//              nothing (O = 0, LSE = -inf). The same boundaries hold for every batch element and head.
//   topk       topk_indices [B, Lq, K] (every head) or [B, Lq, Ht, K] with Ht 1, kv_heads or q_heads (per kv head:
//              query head h reads h / (q_heads / kv_heads)): row q keeps the listed keys, -1 entries (anywhere in
//              the row) ignored, united with the static spec's keys (bound to (q_len, kv_len); none: nothing more).
//
// Every kept (q, k) counts once. A valid mask lists no index twice (within a row, nor a block as both full and
// partial) and no index out of range. Sortedness is never required. Shapes are checked at every call; the checking
// mode (RuntimeMask::check) validates the contents too and raises spattn::Error naming the first bad value or count.
// The host path validates every call's mask; the GPU's device path (docs/RUNTIME_MASKS.md) trusts it (a repeat may
// count twice; an index out of range is dropped) and checks only shapes unless `check` is set. GPU plans run on the
// device path except the cases their explain() names (then the host path: the mask copied to the host, the stream
// waited for; refused under RuntimeMask::no_host).
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "spattn/plan.hpp"

namespace spattn {

// An integer tensor of a run-time mask: int32 or int64, 1 to 4 dimensions, strides in elements; host memory for CPU
// plans, the plan's device's memory for GPU plans. data == nullptr: absent. Standard layout (the C API's
// spattn_index_view is the same record).
struct IndexView {
  const void* data = nullptr;
  int32_t bits = 32;  // 32 or 64
  int32_t ndim = 0;
  std::array<int64_t, 4> shape{0, 0, 0, 0};
  std::array<int64_t, 4> stride{0, 0, 0, 0};

  bool present() const { return data != nullptr; }
  static IndexView of(const int32_t* data, std::initializer_list<int64_t> shape) { return make(data, 32, shape); }
  static IndexView of(const int64_t* data, std::initializer_list<int64_t> shape) { return make(data, 64, shape); }
  // Row-major contiguous view of `shape`.
  static IndexView make(const void* data, int bits, std::initializer_list<int64_t> shape);
  std::string shape_text() const;  // "[1, 16, 256]"
};

enum class MaskKind : uint8_t { blocks, documents, topk };

// What a run-time plan is built for: the kind of mask, its static spec and its sizes; not its contents.
struct MaskLayout {
  MaskKind kind = MaskKind::blocks;
  std::string spec;          // the static spec ("" none): see the semantics above
  int64_t q_block = 128;     // blocks: query and key block sizes (64 or 128 on the GPU; any >= 1 on the CPU)
  int64_t k_block = 128;
  int64_t topk = 0;          // topk: K, the last dimension of topk_indices

  static MaskLayout blocks(int64_t q_block, int64_t k_block, std::string spec = "") {
    return {MaskKind::blocks, std::move(spec), q_block, k_block, 0};
  }
  static MaskLayout documents(std::string spec = "") { return {MaskKind::documents, std::move(spec), 0, 0, 0}; }
  static MaskLayout topk_keys(int64_t k, std::string spec = "") { return {MaskKind::topk, std::move(spec), 0, 0, k}; }
  // Text form (the C API's and the Python operator's): "blocks:QBxKB[:SPEC]", "documents[:SPEC]", "topk:K[:SPEC]"
  // (the spec is the rest of the text, colons included). parse throws Error naming the text.
  static MaskLayout parse(std::string_view text);
  std::string str() const;
  // Throws Error naming the first bad field for `problem` (block sizes < 1, K < 1, a spec that does not parse).
  void validate(const Problem& problem) const;
};

// One call's mask: the tensors of the plan's MaskLayout::kind (the others absent).
struct RuntimeMask {
  IndexView kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices;  // blocks (full_*: optional, together)
  IndexView cu_seqlens_q, cu_seqlens_k;                                      // documents (k: optional)
  IndexView topk_indices;                                                    // topk
  // Checking mode: every shape, count and index is validated before anything runs (GPU plans copy the tensors to the
  // host for it and wait for the stream: not capturable, for debugging and tests).
  bool check = false;
  // Refuse the host path: a GPU call the device path does not take (docs/RUNTIME_MASKS.md) throws Error naming why,
  // instead of copying the mask to the host and waiting for the stream. The Python operator sets it under
  // torch.cuda.set_sync_debug_mode("error"); the C API as bit 2 of its `check` flags. (A call inside a CUDA graph
  // capture refuses the host path whatever this says.)
  bool no_host = false;

  // The tensors in a fixed order (the C API's slots): kv_num_blocks, kv_indices, full_kv_num_blocks,
  // full_kv_indices, cu_seqlens_q, cu_seqlens_k, topk_indices.
  static constexpr int kSlots = 7;
  static constexpr std::array<const char*, kSlots> kSlotNames{"kv_num_blocks", "kv_indices", "full_kv_num_blocks",
                                                              "full_kv_indices", "cu_seqlens_q", "cu_seqlens_k",
                                                              "topk_indices"};
  IndexView& slot(int i);
  const IndexView& slot(int i) const { return const_cast<RuntimeMask*>(this)->slot(i); }
};

// A plan whose mask comes at every call (Plan::forward / backward with a RuntimeMask). Engines: cpu_fused and
// reference (any problem the static engines take), cuda_fused (bf16 / fp16, head dim 64 or 128). Throws Error naming
// the bad field of the layout or the problem.
Plan make_plan(const MaskLayout& layout, const Problem& problem, Device device = Device::cpu(),
               const PlanOptions& options = {});

}  // namespace spattn
