// The Multigrain plan: the split uploaded to the device, the kernels' work lists, and the orchestration of
// SDDMM / softmax / SpMM / attention over the caller's stream plus one side stream (fork/join by events,
// so a run can be captured in a CUDA graph).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <sstream>

#include "cuda/common/check.hpp"
#include "cuda/common/device.hpp"
#include "cuda/unfused/checks.hpp"
#include "cuda/unfused/kernels.hpp"
#include "cuda/unfused/unfused.hpp"

namespace spattn::unfused {

using namespace detail;

namespace {
// SDDMM coarse: a CTA takes at most this many blocks of a block row (local(256) in 64-blocks has 9-10
// blocks a row: 2 CTAs of 5; a global or causal row of 64 blocks: 8 CTAs).
constexpr int kCoarseSlice = 8;
// SDDMM fine on tensor cores: a CTA takes at most this many (128-row super-tile, chunk) pairs of a super-tile.
constexpr int kFineTcSlice = 16;

int64_t align256(int64_t n) { return (n + 255) / 256 * 256; }
// Elements between two heads' S / P in the tiles' order: a multiple of 8 (16-byte groups in TileSoftmax).
int64_t tile_stride(int64_t nnz) { return (nnz + 7) / 8 * 8; }
}  // namespace

struct UnfusedPlan::Impl {
  Problem problem;
  Options options;
  Split split;
  Shape shape;
  float scale = 1;
  CoarseMeta coarse;
  FineMeta fine;
  const int32_t* sddmm_items = nullptr;
  int64_t n_sddmm_items = 0;
  const int32_t* row_order = nullptr;
  const FineItem* fine_items = nullptr;
  int64_t n_fine_items = 0;
  const int32_t* fine_rows = nullptr;  // every row (SpMM fine on CUDA cores, no coarse part)
  int64_t n_fine_rows = 0;
  bool fine_tc = false;                // the fine part runs on tensor cores (tiles below)
  FineTiles tiles;
  const int32_t* tc_items = nullptr;   // SDDMM fine tc: {super-tile, first super-pair, last super-pair}
  int64_t n_tc_items = 0;
  double tile_fill = 0;                // fine nnz / (occupied pairs * 64 * 64)
  bool att_fused = false;              // attention without P runs AttentionFineTc over att_tiles
  int64_t max_tile_entries = 0;        // fine entries of the fullest 64-row tile
  bool tile_path = false;              // attention (with P, or without where att_fused is off) on a fine-only
                                       // tc plan: SDDMM and SpMM in the tiles' entry order, TileSoftmax between
  AttTiles att_tiles;
  int row_blocks_p90 = 0;              // coarse blocks of a block row, 90th percentile of the nonempty ones
  bool pdl = false;                    // sm_90+: the tile path's softmax and SpMM start during the tail of
                                       // the kernel before them (programmatic dependent launch)
  void* device_block = nullptr;
  int64_t device_bytes = 0;
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  int device = 0;

  bool has_coarse() const { return coarse.nblocks > 0; }
  bool has_fine() const { return fine.nnz > 0; }
  bool mixed() const { return has_coarse() && has_fine(); }
  // attention() without P on a tensor-core fine-only plan: the softmax writes only the row LSE and the
  // SpMM exponentiates S as it gathers it (no P written nor read back).
  bool exp_in_spmm() const { return fine_tc && !has_coarse(); }
  // attention() without P on a fine-only tensor-core plan with D == Dv in {64, 128}: one fused kernel
  // (AttentionFineTc) over 128-row tiles; no S, P or workspace.

  ~Impl() {
    // Destructors must not throw: errors here are ignored (the context may already be gone at exit).
    if (join) cudaEventDestroy(join);
    if (fork) cudaEventDestroy(fork);
    if (side) cudaStreamDestroy(side);
    if (device_block) cudaFree(device_block);
  }

  // Runs `side_work` on the side stream and `main_work` on `stream`, concurrently, joined back on `stream`.
  template <class A, class B>
  void both(cudaStream_t stream, A&& main_work, B&& side_work) const {
    SPATTN_CUDA_CHECK(cudaEventRecord(fork, stream));
    SPATTN_CUDA_CHECK(cudaStreamWaitEvent(side, fork, 0));
    side_work(side);
    main_work(stream);
    SPATTN_CUDA_CHECK(cudaEventRecord(join, side));
    SPATTN_CUDA_CHECK(cudaStreamWaitEvent(stream, join, 0));
  }
};

namespace {
// The problem's shape, after the checks the unfused kernels need before the pattern is split (throws naming the
// value that fails).
Shape checked_shape(const BoundPattern& pattern, const Problem& problem) {
  problem.validate();
  if (problem.dtype == DType::f64) throw Error("unfused: dtype f64 is not supported on the GPU (use bf16, f16 or f32)");
  if (pattern.q_len() != problem.q_len || pattern.k_len() != problem.kv_len)
    throw Error("unfused: pattern is bound to " + std::to_string(pattern.q_len()) + " x " +
                std::to_string(pattern.k_len()) + " but the problem is " + std::to_string(problem.q_len) + " x " +
                std::to_string(problem.kv_len));
  const Shape shape = {problem.dtype, problem.batch, problem.q_heads, problem.kv_heads, problem.q_len, problem.kv_len,
                       problem.head_dim, problem.dv()};
  if (Status s = check_shape(shape); !s) throw Error("unfused: " + s.reason);
  const int64_t vec = 16 / dtype_size(problem.dtype);
  const int64_t dmax = problem.dtype == DType::f32 ? 128 : 256;
  for (auto [d, name] : {std::pair{shape.D, "head dim"}, std::pair{shape.Dv, "value dim"}})
    if (d % vec != 0 || d > dmax)
      throw Error(std::string("unfused: ") + name + " " + std::to_string(d) + " must be a multiple of " +
                  std::to_string(vec) + " up to " + std::to_string(dmax) + " for dtype " +
                  std::string(dtype_name(problem.dtype)));
  if (shape.bh() > 65535) throw Error("unfused: batch * q_heads " + std::to_string(shape.bh()) + " exceeds 65535");
  return shape;
}

// The checks on the split itself: the coarse part's head-dim alignment and the index widths of the work lists.
void check_split(const Split& split, const Shape& shape) {
  const Bsr& C = split.coarse;
  const Csr& F = split.fine;
  if (C.nblocks() > 0 && shape.D % 16 != 0)
    throw Error("unfused: head dim " + std::to_string(shape.D) + " must be a multiple of 16 for the coarse part");
  if (C.nblocks() >= (int64_t(1) << 31) || F.nnz() >= (int64_t(1) << 40))
    throw Error("unfused: pattern too large (" + std::to_string(C.nblocks()) + " blocks, " + std::to_string(F.nnz()) + " fine entries)");
}

// The coarse part on the host: the BSR in 32-bit indices, the SDDMM items (block rows sliced into at most
// kCoarseSlice blocks: {block row, first block, last block}) and the block rows longest first.
struct CoarseLists {
  std::vector<int32_t> offsets, cols, mask, items, order;
  int row_blocks_p90 = 0;
};

CoarseLists coarse_lists(const Bsr& C) {
  CoarseLists L;
  L.offsets.assign(C.row_offsets.begin(), C.row_offsets.end());
  L.cols.assign(C.col_indices.begin(), C.col_indices.end());
  L.mask.resize(C.mask_index.size());
  for (size_t i = 0; i < L.mask.size(); ++i) L.mask[i] = int32_t(C.mask_index[i]);
  if (C.nblocks() == 0) return L;
  for (int64_t br = 0; br < C.block_rows; ++br) {
    const int64_t a = C.row_offsets[size_t(br)], b = C.row_offsets[size_t(br) + 1], n = b - a;
    if (n == 0) continue;
    const int64_t pieces = (n + kCoarseSlice - 1) / kCoarseSlice;
    for (int64_t p = 0; p < pieces; ++p)
      L.items.insert(L.items.end(), {int32_t(br), int32_t(a + n * p / pieces), int32_t(a + n * (p + 1) / pieces)});
  }
  std::vector<int64_t> lens;
  for (int64_t br = 0; br < C.block_rows; ++br) {
    const int64_t n = C.row_offsets[size_t(br) + 1] - C.row_offsets[size_t(br)];
    if (n > 0) lens.push_back(n);
  }
  if (!lens.empty()) {
    const size_t k = lens.size() * 9 / 10;
    std::nth_element(lens.begin(), lens.begin() + k, lens.end());
    L.row_blocks_p90 = int(std::min<int64_t>(lens[k], 1 << 20));
  }
  L.order.resize(size_t(C.block_rows));
  std::iota(L.order.begin(), L.order.end(), 0);
  std::stable_sort(L.order.begin(), L.order.end(), [&](int32_t x, int32_t y) {
    return C.row_offsets[size_t(x) + 1] - C.row_offsets[size_t(x)] > C.row_offsets[size_t(y) + 1] - C.row_offsets[size_t(y)];
  });
  return L;
}

// The fine part on CUDA cores: SDDMM items (row slices of at most fine_slice entries) and, without a coarse
// part, every row for the SpMM.
struct FineLists {
  std::vector<FineItem> items;
  std::vector<int32_t> rows;
};

FineLists fine_lists(const Csr& F, int64_t Lq, int64_t fine_slice, bool has_coarse) {
  FineLists L;
  for (int64_t q = 0; q < Lq; ++q) {
    const int64_t a = F.row_offsets[size_t(q)], b = F.row_offsets[size_t(q) + 1];
    for (int64_t s = a; s < b; s += fine_slice)
      L.items.push_back({s, int32_t(q), int32_t(std::min<int64_t>(fine_slice, b - s))});
  }
  if (!has_coarse) {
    L.rows.resize(size_t(Lq));
    std::iota(L.rows.begin(), L.rows.end(), 0);
  }
  return L;
}

// Calls f(q, i, key) for every fine entry i = (row q, key) of the rows [q0, q1), rows and keys ascending.
template <class Fn>
void for_rows_entries(const Csr& F, int64_t q0, int64_t q1, Fn&& f) {
  for (int64_t q = q0; q < q1; ++q)
    for (int64_t i = F.row_offsets[size_t(q)]; i < F.row_offsets[size_t(q) + 1]; ++i) f(q, i, int64_t(F.col_indices[size_t(i)]));
}

// The fine part in 64-row tiles x 64-key chunks: occupied pairs and their entries (FineTiles in kernels.hpp).
struct FineTileLists {
  int64_t ntiles = 0;
  int64_t max_entries = 0;  // entries of the fullest tile
  std::vector<int32_t> pairs, chunk, groups, pos;
  std::vector<uint16_t> rc, pos16;
};

FineTileLists place_fine_tiles(const Csr& F, int64_t Lq, int64_t kv_len) {
  FineTileLists L;
  L.ntiles = (Lq + kFineTileRows - 1) / kFineTileRows;
  const int64_t nchunks = (kv_len + kFineChunkKeys - 1) / kFineChunkKeys;
  std::vector<int32_t> cnt(size_t(nchunks) * 4, 0), touched;
  L.pairs.push_back(0);
  L.groups.push_back(0);
  L.pos.reserve(size_t(F.nnz()));
  L.rc.reserve(size_t(F.nnz()));
  std::vector<int64_t> place;
  for (int64_t t = 0; t < L.ntiles; ++t) {
    const int64_t q0 = t * kFineTileRows, q1 = std::min(Lq, q0 + kFineTileRows);
    touched.clear();
    for_rows_entries(F, q0, q1, [&](int64_t q, int64_t, int64_t key) {
      const int64_t c = key / kFineChunkKeys;
      int32_t* g = &cnt[size_t(c) * 4];
      if (g[0] + g[1] + g[2] + g[3] == 0) touched.push_back(int32_t(c));
      ++g[(q - q0) / 16];
    });
    std::sort(touched.begin(), touched.end());
    // Group starts, in (chunk, warp) order; then place every entry (rows ascending, keys ascending).
    const int64_t base = int64_t(L.pos.size());
    int64_t at = base;
    place.assign(size_t(touched.size()) * 4, 0);
    for (size_t k = 0; k < touched.size(); ++k) {
      for (int w = 0; w < 4; ++w) {
        place[k * 4 + size_t(w)] = at;
        at += cnt[size_t(touched[k]) * 4 + size_t(w)];
        L.groups.push_back(int32_t(at));
      }
      L.chunk.push_back(touched[k]);
    }
    L.pos.resize(size_t(at));
    L.rc.resize(size_t(at));
    for (size_t k = 0; k < touched.size(); ++k) cnt[size_t(touched[k]) * 4] = -int32_t(k) - 1;  // chunk -> slot
    for_rows_entries(F, q0, q1, [&](int64_t q, int64_t i, int64_t key) {
      const int64_t c = key / kFineChunkKeys;
      const size_t k = size_t(-cnt[size_t(c) * 4] - 1);
      const int64_t j = place[k * 4 + size_t((q - q0) / 16)]++;
      L.pos[size_t(j)] = int32_t(i);
      L.rc[size_t(j)] = uint16_t((q - q0) * 64 + (key - c * kFineChunkKeys));
    });
    for (int32_t c : touched)
      for (int w = 0; w < 4; ++w) cnt[size_t(c) * 4 + size_t(w)] = 0;
    L.pos16.resize(size_t(at));  // the places local to the tile (kept where every tile has <= 65536)
    for (int64_t j = base; j < at; ++j) L.pos16[size_t(j)] = uint16_t(L.pos[size_t(j)] - F.row_offsets[size_t(q0)]);
    L.max_entries = std::max<int64_t>(L.max_entries, at - base);
    const int64_t p0 = L.pairs.back(), n = int64_t(touched.size());
    L.pairs.push_back(int32_t(p0 + n));
  }
  return L;
}

// 128-row super-tiles: the chunks of tiles 2T and 2T + 1 merged (both lists ascending), each with the entry
// ranges of the two tiles' 16-row groups; SDDMM items ({super-tile, first super-pair, last super-pair}) slice a
// super-tile's super-pairs.
struct SuperTileLists {
  int64_t nsuper = 0;
  std::vector<int32_t> pairs, chunk, bounds, items;
};

SuperTileLists merge_super_tiles(const FineTileLists& t) {
  SuperTileLists L;
  const int64_t ntiles = t.ntiles;
  L.nsuper = (ntiles + 1) / 2;
  L.pairs.push_back(0);
  for (int64_t T = 0; T < L.nsuper; ++T) {
    int32_t ia = t.pairs[size_t(2 * T)], ea = t.pairs[size_t(2 * T) + 1];
    int32_t ib = 2 * T + 1 < ntiles ? t.pairs[size_t(2 * T) + 1] : 0, eb = 2 * T + 1 < ntiles ? t.pairs[size_t(2 * T) + 2] : 0;
    const int64_t s0 = int64_t(L.chunk.size());
    while (ia < ea || ib < eb) {
      const int32_t ca = ia < ea ? t.chunk[size_t(ia)] : INT32_MAX, cb = ib < eb ? t.chunk[size_t(ib)] : INT32_MAX;
      const int32_t c = std::min(ca, cb);
      L.chunk.push_back(c);
      for (int half = 0; half < 2; ++half) {
        const bool has = half == 0 ? ca == c : cb == c;
        const int32_t pp = half == 0 ? ia : ib;
        for (int w = 0; w < 4; ++w) {
          L.bounds.push_back(has ? t.groups[size_t(pp) * 4 + size_t(w)] : 0);
          L.bounds.push_back(has ? t.groups[size_t(pp) * 4 + size_t(w) + 1] : 0);
        }
      }
      if (ca == c) ++ia;
      if (cb == c) ++ib;
    }
    const int64_t n = int64_t(L.chunk.size()) - s0;
    const int64_t pieces = (n + kFineTcSlice - 1) / kFineTcSlice;
    for (int64_t k = 0; k < pieces; ++k)
      L.items.insert(L.items.end(), {int32_t(T), int32_t(s0 + n * k / pieces), int32_t(s0 + n * (k + 1) / pieces)});
    L.pairs.push_back(int32_t(L.chunk.size()));
  }
  return L;
}

// Fused attention without P (fine-only tc plans, D == Dv in {64, 128}): occupied (128-row tile, 64-key chunk)
// pairs, each with a 128 x 64 bitmask of the kept entries.
struct AttTileLists {
  int64_t ntiles = 0;
  std::vector<int32_t> pairs, chunk;
  std::vector<uint64_t> masks;
};

AttTileLists att_tile_lists(const Csr& F, int64_t Lq, int64_t kv_len) {
  AttTileLists L;
  L.ntiles = (Lq + kAttTileRows - 1) / kAttTileRows;
  const int64_t nchunks = (kv_len + kFineChunkKeys - 1) / kFineChunkKeys;
  std::vector<int32_t> slot(size_t(nchunks), -1), touched;
  L.pairs.push_back(0);
  for (int64_t t = 0; t < L.ntiles; ++t) {
    const int64_t q0 = t * kAttTileRows, q1 = std::min(Lq, q0 + kAttTileRows);
    touched.clear();
    for_rows_entries(F, q0, q1, [&](int64_t, int64_t, int64_t key) {
      const int64_t c = key / kFineChunkKeys;
      if (slot[size_t(c)] < 0) {
        slot[size_t(c)] = 0;
        touched.push_back(int32_t(c));
      }
    });
    std::sort(touched.begin(), touched.end());
    const size_t base = L.chunk.size();
    for (size_t k = 0; k < touched.size(); ++k) {
      slot[size_t(touched[k])] = int32_t(base + k);
      L.chunk.push_back(touched[k]);
    }
    L.masks.resize(L.chunk.size() * kAttTileRows, 0);
    for_rows_entries(F, q0, q1, [&](int64_t q, int64_t, int64_t key) {
      const int64_t c = key / kFineChunkKeys;
      L.masks[size_t(slot[size_t(c)]) * kAttTileRows + size_t(q - q0)] |= uint64_t(1) << (key - c * kFineChunkKeys);
    });
    for (int32_t c : touched) slot[size_t(c)] = -1;
    L.pairs.push_back(int32_t(L.chunk.size()));
  }
  return L;
}

// Every host list of a plan, as upload() copies them to the device.
struct HostLists {
  CoarseLists coarse;
  FineLists fine;
  FineTileLists tiles;
  SuperTileLists super;
  AttTileLists att;
};

// One device allocation for all of the lists (256-byte aligned pieces), the plan's pointers into it, and the
// side stream and events of the fork/join.
void upload(UnfusedPlan::Impl& P, const HostLists& h) {
  const Bsr& C = P.split.coarse;
  const Csr& F = P.split.fine;
  struct Piece {
    const void* src;
    int64_t bytes;
    int64_t offset;
  };
  std::vector<Piece> pieces;
  int64_t total = 0;
  auto add = [&](const void* src, int64_t bytes) {
    pieces.push_back({src, bytes, total});
    total += align256(std::max<int64_t>(bytes, 1));
    return pieces.size() - 1;
  };
  const size_t i_coff = add(h.coarse.offsets.data(), int64_t(h.coarse.offsets.size() * 4));
  const size_t i_ccol = add(h.coarse.cols.data(), int64_t(h.coarse.cols.size() * 4));
  const size_t i_cmask = add(h.coarse.mask.data(), int64_t(h.coarse.mask.size() * 4));
  const size_t i_masks = add(C.masks.data(), int64_t(C.masks.size() * 8));
  const size_t i_items = add(h.coarse.items.data(), int64_t(h.coarse.items.size() * 4));
  const size_t i_order = add(h.coarse.order.data(), int64_t(h.coarse.order.size() * 4));
  const size_t i_foff = add(F.row_offsets.data(), int64_t(F.row_offsets.size() * 8));
  const size_t i_fcol = add(F.col_indices.data(), int64_t(F.col_indices.size() * 4));
  const size_t i_fitems = add(h.fine.items.data(), int64_t(h.fine.items.size() * sizeof(FineItem)));
  const size_t i_frows = add(h.fine.rows.data(), int64_t(h.fine.rows.size() * 4));
  const size_t i_tpairs = add(h.tiles.pairs.data(), int64_t(h.tiles.pairs.size() * 4));
  const size_t i_tchunk = add(h.tiles.chunk.data(), int64_t(h.tiles.chunk.size() * 4));
  const size_t i_tgroups = add(h.tiles.groups.data(), int64_t(h.tiles.groups.size() * 4));
  const size_t i_tpos = add(h.tiles.pos.data(), int64_t(h.tiles.pos.size() * 4));
  const size_t i_trc = add(h.tiles.rc.data(), int64_t(h.tiles.rc.size() * 2));
  const size_t i_tpos16 = add(h.tiles.pos16.data(), int64_t(h.tiles.pos16.size() * 2));
  const size_t i_titems = add(h.super.items.data(), int64_t(h.super.items.size() * 4));
  const size_t i_spairs = add(h.super.pairs.data(), int64_t(h.super.pairs.size() * 4));
  const size_t i_schunk = add(h.super.chunk.data(), int64_t(h.super.chunk.size() * 4));
  const size_t i_sbounds = add(h.super.bounds.data(), int64_t(h.super.bounds.size() * 4));
  const size_t i_apairs = add(h.att.pairs.data(), int64_t(h.att.pairs.size() * 4));
  const size_t i_achunk = add(h.att.chunk.data(), int64_t(h.att.chunk.size() * 4));
  const size_t i_amasks = add(h.att.masks.data(), int64_t(h.att.masks.size() * 8));

  P.device = cuda::current_device();
  P.pdl = cuda::device_info(P.device).cc >= 90;
  SPATTN_CUDA_CHECK(cudaMalloc(&P.device_block, size_t(total)));
  P.device_bytes = total;
  char* base = static_cast<char*>(P.device_block);
  for (const Piece& p : pieces)
    if (p.bytes > 0) SPATTN_CUDA_CHECK(cudaMemcpy(base + p.offset, p.src, size_t(p.bytes), cudaMemcpyHostToDevice));
  auto at = [&](size_t i) -> void* { return pieces[i].bytes > 0 ? base + pieces[i].offset : nullptr; };

  P.coarse = {P.split.block, C.block_rows, C.nblocks(), static_cast<int32_t*>(at(i_coff)), static_cast<int32_t*>(at(i_ccol)),
              static_cast<int32_t*>(at(i_cmask)), static_cast<uint64_t*>(at(i_masks))};
  P.fine = {F.nnz(), static_cast<int64_t*>(at(i_foff)), static_cast<int32_t*>(at(i_fcol))};
  P.sddmm_items = static_cast<int32_t*>(at(i_items));
  P.n_sddmm_items = int64_t(h.coarse.items.size() / 3);
  P.row_order = static_cast<int32_t*>(at(i_order));
  P.fine_items = static_cast<FineItem*>(at(i_fitems));
  P.n_fine_items = int64_t(h.fine.items.size());
  P.fine_rows = static_cast<int32_t*>(at(i_frows));
  P.n_fine_rows = int64_t(h.fine.rows.size());
  P.tiles.tile_pairs = static_cast<int32_t*>(at(i_tpairs));
  P.tiles.pair_chunk = static_cast<int32_t*>(at(i_tchunk));
  P.tiles.groups = static_cast<int32_t*>(at(i_tgroups));
  P.tiles.pos = static_cast<int32_t*>(at(i_tpos));
  P.tiles.rc = static_cast<uint16_t*>(at(i_trc));
  P.tiles.pos16 = static_cast<uint16_t*>(at(i_tpos16));
  P.tc_items = static_cast<int32_t*>(at(i_titems));
  P.tiles.super_pairs = static_cast<int32_t*>(at(i_spairs));
  P.tiles.sp_chunk = static_cast<int32_t*>(at(i_schunk));
  P.tiles.sp_bounds = static_cast<int32_t*>(at(i_sbounds));
  P.n_tc_items = int64_t(h.super.items.size() / 3);
  P.att_tiles.tile_pairs = static_cast<int32_t*>(at(i_apairs));
  P.att_tiles.pair_chunk = static_cast<int32_t*>(at(i_achunk));
  P.att_tiles.masks = static_cast<uint64_t*>(at(i_amasks));

  SPATTN_CUDA_CHECK(cudaStreamCreateWithFlags(&P.side, cudaStreamNonBlocking));
  SPATTN_CUDA_CHECK(cudaEventCreateWithFlags(&P.fork, cudaEventDisableTiming));
  SPATTN_CUDA_CHECK(cudaEventCreateWithFlags(&P.join, cudaEventDisableTiming));
}
}  // namespace

UnfusedPlan UnfusedPlan::build(const BoundPattern& pattern, const Problem& problem, const Options& options) {
  auto impl = std::make_shared<Impl>();
  Impl& P = *impl;
  P.shape = checked_shape(pattern, problem);
  P.problem = problem;
  P.options = options;
  P.scale = float(problem.softmax_scale());
  P.split = split_pattern(pattern, options, problem.dtype);
  check_split(P.split, P.shape);
  const Bsr& C = P.split.coarse;
  const Csr& F = P.split.fine;
  const int64_t Lq = problem.q_len;
  const bool has_coarse = C.nblocks() > 0, has_fine = F.nnz() > 0;

  HostLists h;
  h.coarse = coarse_lists(C);
  P.row_blocks_p90 = h.coarse.row_blocks_p90;
  h.fine = fine_lists(F, Lq, options.fine_slice, has_coarse);
  // The fine part on tensor cores where its 64 x 64 tiles are full enough.
  const bool tc_ok = has_fine && (problem.dtype == DType::bf16 || problem.dtype == DType::f16) &&
                     P.shape.D % 16 == 0 && F.nnz() < (int64_t(1) << 31) && options.fine_tc_min_fill <= 1.0;
  if (tc_ok) {
    h.tiles = place_fine_tiles(F, Lq, problem.kv_len);
    P.max_tile_entries = h.tiles.max_entries;
    P.tile_fill = h.tiles.chunk.empty()
                      ? 0.0
                      : double(F.nnz()) / (double(h.tiles.chunk.size()) * kFineTileRows * kFineChunkKeys);
    P.fine_tc = P.tile_fill >= options.fine_tc_min_fill;
    P.tile_path = P.fine_tc && !has_coarse && P.max_tile_entries <= TileSoftmax::kMaxTileEntries;
    if (!P.tile_path || P.max_tile_entries > 65536) h.tiles.pos16.clear();
    if (!P.fine_tc) {
      h.tiles.pairs.clear(); h.tiles.chunk.clear(); h.tiles.groups.clear(); h.tiles.pos.clear(); h.tiles.rc.clear();
    } else {
      P.tiles.ntiles = h.tiles.ntiles;
      P.tiles.npairs = int64_t(h.tiles.chunk.size());
      h.super = merge_super_tiles(h.tiles);
      P.tiles.nsuper = h.super.nsuper;
      P.tiles.nspairs = int64_t(h.super.chunk.size());
    }
  }
  if (P.fine_tc && !has_coarse && options.fused_fine_attention && P.shape.D == P.shape.Dv &&
      (P.shape.D == 64 || P.shape.D == 128)) {
    h.att = att_tile_lists(F, Lq, problem.kv_len);
    P.att_fused = true;
    P.att_tiles.ntiles = h.att.ntiles;
    P.att_tiles.npairs = int64_t(h.att.chunk.size());
  }
  upload(P, h);
  UnfusedPlan plan;
  plan.impl_ = std::move(impl);
  return plan;
}

const Problem& UnfusedPlan::problem() const { return impl_->problem; }
const Split& UnfusedPlan::split() const { return impl_->split; }
bool UnfusedPlan::has_coarse() const { return impl_->has_coarse(); }
bool UnfusedPlan::has_fine() const { return impl_->has_fine(); }
int64_t UnfusedPlan::coarse_elems_per_head() const { return impl_->coarse.nblocks * impl_->split.block * impl_->split.block; }
int64_t UnfusedPlan::fine_elems_per_head() const { return impl_->fine.nnz; }
int64_t UnfusedPlan::score_bytes() const { return prob_bytes(); }
int64_t UnfusedPlan::prob_bytes() const {
  return (coarse_elems_per_head() + fine_elems_per_head()) * impl_->shape.bh() * dtype_size(impl_->shape.dtype);
}
int64_t UnfusedPlan::spmm_workspace_size() const { return 0; }
int64_t UnfusedPlan::attention_workspace_size(bool p_given) const {
  const Impl& P = *impl_;
  const int64_t bh = P.shape.bh(), ds = dtype_size(P.shape.dtype);
  if (!p_given && P.att_fused) return 0;  // one fused kernel: nothing in memory between the steps
  if (P.tile_path)  // S (tile order, heads 8 entries apart), overwritten by P; 256 to align the base
    return align256(bh * tile_stride(P.fine.nnz) * ds) + 256;
  int64_t n = align256(bh * coarse_elems_per_head() * ds) + align256(bh * fine_elems_per_head() * ds);
  if (!p_given && P.exp_in_spmm())
    n += align256(bh * P.shape.Lq * 4);  // log2-domain row LSE for the SpMM
  else if (!p_given)
    n += align256(bh * coarse_elems_per_head() * ds) + align256(bh * fine_elems_per_head() * ds);
  return n + spmm_workspace_size();
}

std::string UnfusedPlan::explain() const {
  const Impl& P = *impl_;
  std::ostringstream os;
  os << "unfused plan: " << dtype_name(P.shape.dtype) << ", B " << P.shape.B << ", Hq " << P.shape.Hq << ", Hkv "
     << P.shape.Hkv << ", D " << P.shape.D << ", Dv " << P.shape.Dv << ", scale " << P.scale << "\n";
  os << P.split.describe();
  os << "  kernels: ";
  if (P.has_coarse())
    os << "sddmm_coarse<" << P.split.block << "> (" << P.n_sddmm_items << " row slices), spmm_coarse<" << P.split.block
       << ">; ";
  if (P.has_fine() && P.fine_tc)
    os << "sddmm_fine_tc (" << P.tiles.npairs << " 64x64 tiles, fill " << P.tile_fill << ", " << P.n_tc_items
       << " slices of " << P.tiles.nspairs << " 128x64 tiles)" << (P.has_coarse() ? "; " : ", spmm_fine_tc; ");
  else if (P.has_fine())
    os << "sddmm_fine (" << P.n_fine_items << " row slices" << (P.tile_fill > 0 ? ", 64x64 tile fill " : "")
       << (P.tile_fill > 0 ? std::to_string(P.tile_fill) : std::string()) << ")" << (P.has_coarse() ? "; " : ", spmm_fine; ");
  if (P.mixed()) os << "spmm fine entries fused into spmm_coarse's epilogue; ";
  if (P.tile_path)
    os << "attention with P: sddmm_fine_tc -> tile_softmax -> spmm_fine_tc in tile order (fullest tile "
       << P.max_tile_entries << " entries); ";
  if (P.att_fused)
    os << "attention without P: attention_fine_tc (" << P.att_tiles.npairs << " 128x64 tiles, fused, no S/P); ";
  os << "softmax (compound)";
  if (P.mixed()) os << "; SDDMM coarse and fine on two streams";
  os << "\n  device metadata: " << P.device_bytes << " bytes\n";
  return os.str();
}

namespace {
Dense dense_of(const TensorView& t, const char* name) {
  if (t.stride[3] != 1)
    throw Error(std::string("unfused: ") + name + " has innermost stride " + std::to_string(t.stride[3]) +
                " (must be 1)");
  return {t.data, t.stride[0], t.stride[1], t.stride[2]};
}
void check_dtype(const TensorView& t, DType want, const char* name) {
  if (t.dtype != want)
    throw Error(std::string("unfused: ") + name + " has dtype " + std::string(dtype_name(t.dtype)) +
                ", the plan was built for " + std::string(dtype_name(want)));
}
}  // namespace

void UnfusedPlan::sddmm(const TensorView& q, const TensorView& k, SparseValues s, Stream user_stream) const {
  const auto stream = static_cast<cudaStream_t>(user_stream);
  const Impl& P = *impl_;
  const Shape& sh = P.shape;
  Problem::check_view(q, "q", {sh.B, sh.Lq, sh.Hq, sh.D});
  Problem::check_view(k, "k", {sh.B, sh.Lk, sh.Hkv, sh.D});
  check_dtype(q, sh.dtype, "q");
  check_dtype(k, sh.dtype, "k");
  if (P.has_coarse() && !s.coarse) throw Error("unfused: sddmm: S coarse is null but the plan has coarse blocks");
  if (P.has_fine() && !s.fine) throw Error("unfused: sddmm: S fine is null but the plan has fine entries");
  SddmmCoarse::Arguments ca{sh, dense_of(q, "q"), dense_of(k, "k"), P.coarse, P.sddmm_items, P.n_sddmm_items,
                            s.coarse};
  SddmmFine::Arguments fa{sh, dense_of(q, "q"), dense_of(k, "k"), P.fine, P.fine_items, P.n_fine_items,
                          s.fine};
  SddmmFineTc::Arguments ta{sh, dense_of(q, "q"), dense_of(k, "k"), P.tiles, P.fine.nnz, P.tc_items, P.n_tc_items,
                            s.fine};
  if (P.has_coarse()) require(SddmmCoarse::can_implement(ca), "SddmmCoarse");
  if (P.has_fine()) P.fine_tc ? require(SddmmFineTc::can_implement(ta), "SddmmFineTc") : require(SddmmFine::can_implement(fa), "SddmmFine");
  auto fine = [&](cudaStream_t st) { P.fine_tc ? SddmmFineTc::run(ta, st) : SddmmFine::run(fa, st); };
  if (P.mixed())
    P.both(stream, [&](cudaStream_t st) { SddmmCoarse::run(ca, st); }, fine);
  else if (P.has_coarse())
    SddmmCoarse::run(ca, stream);
  else if (P.has_fine())
    fine(stream);
}

void UnfusedPlan::softmax(SparseValues s, SparseValues p, float* lse, Stream user_stream) const {
  const auto stream = static_cast<cudaStream_t>(user_stream);
  const Impl& P = *impl_;
  CompoundSoftmax::Arguments a;
  a.shape = P.shape;
  a.scale = P.scale;
  a.coarse = P.coarse;
  a.fine = P.fine;
  a.s_coarse = s.coarse;
  a.s_fine = s.fine;
  a.p_coarse = p.coarse;
  a.p_fine = p.fine;
  a.lse = lse;
  a.row_blocks_hint = P.row_blocks_p90;
  CompoundSoftmax::run(a, stream);
}

void UnfusedPlan::spmm(SparseValues p, const TensorView& v, const TensorView& o, void* workspace, Stream user_stream) const {
  const auto stream = static_cast<cudaStream_t>(user_stream);
  const Impl& P = *impl_;
  const Shape& sh = P.shape;
  Problem::check_view(v, "v", {sh.B, sh.Lk, sh.Hkv, sh.Dv});
  Problem::check_view(o, "o", {sh.B, sh.Lq, sh.Hq, sh.Dv});
  check_dtype(v, sh.dtype, "v");
  check_dtype(o, sh.dtype, "o");
  if (P.has_coarse() && !p.coarse) throw Error("unfused: spmm: P coarse is null but the plan has coarse blocks");
  if (P.has_fine() && !p.fine) throw Error("unfused: spmm: P fine is null but the plan has fine entries");
  (void)workspace;  // none needed: the fine entries of a mixed plan are added in spmm_coarse's epilogue
  if (P.has_coarse()) {
    SpmmCoarse::Arguments ca{sh, p.coarse, dense_of(v, "v"), dense_of(o, "o"), P.coarse, P.row_order,
                             P.mixed() ? P.fine : FineMeta{}, P.mixed() ? p.fine : nullptr};
    SpmmCoarse::run(ca, stream);
  } else if (P.fine_tc) {
    SpmmFineTc::Arguments ta{sh, p.fine, dense_of(v, "v"), dense_of(o, "o"), P.tiles, P.fine.nnz};
    SpmmFineTc::run(ta, stream);
  } else {
    SpmmFine::Arguments fa{sh, p.fine, dense_of(v, "v"), dense_of(o, "o"), P.fine, P.fine_rows, P.n_fine_rows, nullptr};
    SpmmFine::run(fa, stream);  // every row, so rows without entries get O = 0
  }
}

void UnfusedPlan::attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o, float* lse,
                            SparseValues p, void* workspace, Stream user_stream) const {
  const auto stream = static_cast<cudaStream_t>(user_stream);
  const Impl& P = *impl_;
  const bool p_given = p.coarse || p.fine;
  if (p_given && ((P.has_coarse() && !p.coarse) || (P.has_fine() && !p.fine)))
    throw Error("unfused: attention: P was given for only one of the plan's parts");
  const int64_t need = attention_workspace_size(p_given);
  if (need > 0 && !workspace) throw Error("unfused: attention needs a workspace of " + std::to_string(need) + " bytes");
  const int64_t bh = P.shape.bh(), ds = dtype_size(P.shape.dtype);
  char* w = static_cast<char*>(workspace);
  auto take = [&](int64_t bytes) -> void* {
    void* r = bytes > 0 ? w : nullptr;
    w += align256(bytes);
    return r;
  };
  const Shape& sh = P.shape;
  auto check_qkvo = [&] {  // the views the single-route paths below read without sddmm() / spmm()
    Problem::check_view(q, "q", {sh.B, sh.Lq, sh.Hq, sh.D});
    Problem::check_view(k, "k", {sh.B, sh.Lk, sh.Hkv, sh.D});
    Problem::check_view(v, "v", {sh.B, sh.Lk, sh.Hkv, sh.Dv});
    Problem::check_view(o, "o", {sh.B, sh.Lq, sh.Hq, sh.Dv});
    for (auto [t, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}, std::pair{&o, "o"}})
      check_dtype(*t, sh.dtype, name);
  };
  if (!p_given && P.att_fused) {
    check_qkvo();
    AttentionFineTc::Arguments fa{sh, dense_of(q, "q"), dense_of(k, "k"), dense_of(v, "v"), dense_of(o, "o"),
                                  P.att_tiles, P.scale, lse};
    AttentionFineTc::run(fa, stream);
    return;
  }
  if (P.tile_path) {  // fine-only tensor-core plan: S and P between the kernels in the tiles' entry order
    check_qkvo();
    w = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(w) + 255) / 256 * 256);  // 16-byte groups
    const int64_t stride = tile_stride(P.fine.nnz);
    void* st = take(bh * stride * ds);
    // The tile-order kernels take the head stride as their nnz (they index entries within a head only).
    SddmmFineTc::Arguments da{sh, dense_of(q, "q"), dense_of(k, "k"), P.tiles, stride, P.tc_items, P.n_tc_items, st};
    da.tile_order = true;
    TileSoftmax::Arguments sa;
    sa.shape = sh;
    sa.scale = P.scale;
    sa.fine = P.fine;
    sa.tiles = P.tiles;
    sa.max_tile_entries = P.max_tile_entries;
    sa.s = st;
    sa.s_stride = stride;
    sa.p_csr = p_given ? p.fine : nullptr;
    sa.lse = lse;
    sa.pdl = P.pdl;
    SpmmFineTc::Arguments ma{sh, st, dense_of(v, "v"), dense_of(o, "o"), P.tiles, stride};
    ma.tile_order = true;
    ma.pdl = P.pdl;

    require(SddmmFineTc::can_implement(da), "SddmmFineTc");
    require(TileSoftmax::can_implement(sa), "TileSoftmax");
    require(SpmmFineTc::can_implement(ma), "SpmmFineTc");
    SddmmFineTc::run(da, stream);
    TileSoftmax::run(sa, stream);
    SpmmFineTc::run(ma, stream);
    return;
  }
  SparseValues s{take(bh * coarse_elems_per_head() * ds), take(bh * fine_elems_per_head() * ds)};
  if (!p_given && P.exp_in_spmm()) {
    float* lse2 = static_cast<float*>(take(bh * P.shape.Lq * 4));
    sddmm(q, k, s, stream);
    CompoundSoftmax::Arguments a;
    a.shape = P.shape;
    a.scale = P.scale;
    a.coarse = P.coarse;
    a.fine = P.fine;
    a.s_fine = s.fine;
    a.lse = lse;
    a.lse2 = lse2;  // P stays null: LSE only
    CompoundSoftmax::run(a, stream);
    Problem::check_view(v, "v", {P.shape.B, P.shape.Lk, P.shape.Hkv, P.shape.Dv});
    Problem::check_view(o, "o", {P.shape.B, P.shape.Lq, P.shape.Hq, P.shape.Dv});
    check_dtype(v, P.shape.dtype, "v");
    check_dtype(o, P.shape.dtype, "o");
    SpmmFineTc::Arguments ta{P.shape, s.fine, dense_of(v, "v"), dense_of(o, "o"), P.tiles, P.fine.nnz};
    ta.lse2 = lse2;
    ta.sl2 = P.scale * 1.4426950408889634f;
    SpmmFineTc::run(ta, stream);
    return;
  }
  if (!p_given) p = {take(bh * coarse_elems_per_head() * ds), take(bh * fine_elems_per_head() * ds)};
  void* spmm_ws = spmm_workspace_size() > 0 ? w : nullptr;
  sddmm(q, k, s, stream);
  softmax(s, p, lse, stream);
  spmm(p, v, o, spmm_ws, stream);
}

}  // namespace spattn::unfused
