// cpu/fused_internal.hpp — what the fused CPU attention's forward (fused.cpp) and backward (fused_backward.cpp)
// share: the plan of one pattern (its tiles, key blocks, row masks and residue lists, built by fused.cpp's tiler),
// FusedPlan's state, and the buffers and row conversions of the drivers. Internal to src/cpu; never included by the
// ISA translation units (fused_kernel.hpp says why).
#pragma once
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <stdlib.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "common/alloc.hpp"
#include "cpu/fused_kernel.hpp"
#include "cpu/fused_plan.hpp"
#include "plan/tile_map.hpp"
#include "spattn/pattern.hpp"
#include "spattn/tensor.hpp"

namespace spattn::cpu {
namespace fused {

// ---- the plan of one pattern ------------------------------------------------------------------------------
struct TileInfo {
  int64_t q_off;  // into qidx
  int32_t rows;
  int32_t store;  // its KeyStore
  int64_t blk_begin, blk_end;
  int64_t res;  // into res_off / res_cnt (rows entries), -1: no residue
  double cost;
};

// Residue keys: written once, in huge pages (common/alloc.hpp).
template <class T>
using KeyAlloc = common::HugeUninitAllocator<T>;

// The keys of the dense blocks, their row masks and the residue keys of a run of whole work items (the tiles
// one build task made): each task's stay where it wrote them rather than being copied into one array
// (random(820) at L = 16384 has 54 MB of residue keys; copying them was a quarter of its plan time).
struct KeyStore {
  std::vector<int32_t> keys;
  std::vector<uint32_t> masks;
  std::vector<int32_t, KeyAlloc<int32_t>> res_keys;  // each row's list padded to a multiple of the vector width
};

struct PatternPlan {
  std::vector<int32_t> qidx;
  std::vector<TileInfo> tiles;
  std::vector<KeyBlock> blocks;   // KeyBlock::keys / ::mask: offsets into the tile's store (keys / masks)
  std::vector<int64_t> res_off;   // per tile row with residue: offset into its tile's store's res_keys
  std::vector<int32_t> res_cnt;   // its key count
  std::vector<KeyStore> stores;   // the work items of one store are whole groups (below)
  int64_t dense_scores = 0, masked_scores = 0, residue_nnz = 0, residue_runs = 0;
  // Work items: groups of consecutive tiles [group[i], group[i + 1]). Residue-heavy plans (random) group
  // kMaxGroup tiles so the kernel can run their residue in key passes that stay in L2.
  std::vector<int32_t> group;
  std::vector<TileRef> refs;  // [tiles], pointing into the vectors above
  int32_t key_pass = 0, npass = 0;  // residue key passes (grouped plans over long key ranges)
  std::vector<int32_t> res_pass;    // [residue rows][npass] ends, see TileRef::res_pass
  std::vector<int64_t> res_pass_off;  // per tile: offset into res_pass, -1: none
  bool residue_heavy = false;
  int perm = 1;
  std::string boxes;  // query tiles as grid boxes (PlanStats::boxes)
  plan::TileBox tile_box;
};

// A float buffer, 64-byte aligned, not initialised; reuse() keeps its storage across calls (growing only), so
// per-call copies do not pay page faults and zero fill again.
// huge: 2 MiB aligned and advised for transparent huge pages (Linux), for buffers read at scattered rows: the
// packed K/V of random(205) at L = 4096 spans 512 pages of 4 KiB per head, and every score's row is a data-TLB
// miss in the first level.
struct AlignedFloats {
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float[], Free> store;
  int64_t cap = 0;
  float* ptr = nullptr;
  bool huge = false;
  void resize(int64_t n) {
    if (n + 16 > cap) {
      store.reset();
      const size_t bytes = size_t(n + 16) * sizeof(float);
      constexpr size_t kHuge = size_t(2) << 20;
      void* mem = nullptr;
      if (huge && bytes >= kHuge) {
        const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
        if (posix_memalign(&mem, kHuge, rounded) == 0) {
#ifdef MADV_HUGEPAGE
          madvise(mem, rounded, MADV_HUGEPAGE);
#endif
        } else {
          mem = nullptr;
        }
      }
      if (!mem && posix_memalign(&mem, 64, bytes) != 0) throw std::bad_alloc();
      store.reset(static_cast<float*>(mem));
      cap = n + 16;
    }
    ptr = store.get();
  }
};

// Threads for Options::threads (0: all hardware threads; negative: an Error naming the value).
int resolve_threads(int threads);
// Row (b, l, h) of a [B, L, H, D] view as fp32: D values to out[0, D), zeros to out[D, width).
void convert_row(const TensorView& t, int64_t b, int64_t l, int64_t h, float* out, int64_t width);
// K and V rows [l0, l1) of batch b into the packed [B][HK][Lk][DP + DVP] buffer (a key's K row, then its V row; the
// backward packs Q and dO the same way). Token-major: each input is read front to back, every head of a token from
// one stretch of memory.
void pack_kv_rows(const TensorView& k, const TensorView& v, float* dst, int64_t DP, int64_t DVP, int64_t b, int64_t l0,
                  int64_t l1);
// Per thread (the caller and the kept workers), the kernels' scratch, kept across calls.
AlignedFloats& scratch_buffer();

}  // namespace fused

struct FusedPlan::Impl {
  Problem problem;
  std::vector<BoundPattern> patterns;  // one for all heads or one per query head (rows redone in fp64)
  const fused::KernelSet* ks = nullptr;
  std::vector<fused::PatternPlan> plans;
  std::vector<int> plan_of_head;  // [Hq]
  struct Item {
    int32_t bh, plan, group;
  };
  // Work items (batch x head, tile): most expensive first (longest-processing-time order), and among tiles of
  // about the same cost (within a factor sqrt 2) head by head, tile by tile, so the threads share one head's
  // K/V in cache and neighbouring tiles share keys.
  std::vector<Item> items;
  PlanStats stats;
  // The backward's view of each pattern plan's tiles, made at its first call (fused_backward.cpp): per tile the
  // range [first, last] of the keys it keeps (the dK / dV rows it adds to; first > last: none).
  mutable std::once_flag bwd_once;
  mutable std::vector<std::vector<std::pair<int32_t, int32_t>>> tile_keys;
};

}  // namespace spattn::cpu
