// cpu/fused_kernel.hpp — the contract between the fused CPU attention driver (fused.cpp) and its
// per-ISA tile kernels (fused_avx512.cpp, fused_avx2.cpp, fused_generic.cpp, all from fused_kernels.inc).
//
// Plain data only: the ISA translation units are compiled with wider target options and must not share
// inline or template code with the rest of the program (a COMDAT copy built for AVX-512 that the linker
// picks for everyone would fault on a machine without it).
#pragma once
#include <cstdint>

namespace spattn::cpu::fused {

// One block of keys that every row of a query tile visits: n keys (token indices at keys[0..n)), either
// full (every row keeps every key: mask == nullptr) or partial (mask[j] bit r: tile row r keeps key j).
struct KeyBlock {
  int32_t n;
  int32_t mask;  // -1: full; else offset into TileArgs::masks (n words)
  int64_t keys;  // offset into TileArgs::keys
};

// Everything one (batch, head, query tile) needs. All tensors are fp32 by the time they get here.
struct TileArgs {
  int64_t D, Dv;        // head dim, value dim
  int64_t DP, DVP;      // D and Dv rounded up to the vector width (scratch layouts)
  float qscale;         // softmax scale * log2(e): scores are kept in base 2
  // Q of this (b, h): element (t, d) at q[t * q_ld + d * q_inc].
  const float* q;
  int64_t q_ld, q_inc;
  // K / V of this (b, hk): row t at k + t * k_ld (D floats, or DP when D is not a multiple of the width:
  // then the row is zero padded), v + t * v_ld (Dv floats, zero padded to DVP likewise).
  const float* k;
  int64_t k_ld;
  const float* v;
  int64_t v_ld;
  // O of this (b, h): element (t, c) at o[t * o_ld + c * o_inc]; lse (may be null) at lse[t * lse_inc].
  float* o;
  int64_t o_ld, o_inc;
  float* lse;
  int64_t lse_inc;
  // The tiles of this work item (plan data): one, or a group of residue-heavy tiles run together so their
  // residue keys can be visited in key passes (below).
  const struct TileRef* tiles;
  int32_t ntiles;  // <= kMaxGroup
  // Residue key passes: 0, or visit every row's residue keys below key_pass, then below 2 * key_pass, ...
  // (each row's residue list is ascending), so one pass's K/V rows stay in L2 for all rows of the group.
  int32_t key_pass;
  int32_t npass;
  const int32_t* keys;
  const uint32_t* masks;
  const int32_t* res_keys;
  bool res_prefetch;  // the residue keys are scattered: prefetch the first line of their K/V rows ahead
  bool res_off32;     // every K / V row offset (token * k_ld, token * v_ld) fits an int32: 32-bit addressing
  // The first tile of the work item the calling thread runs next (null: none) and that item's Q base (as q
  // above): its Q rows are prefetched during this item's last tile.
  const struct TileRef* next_tile;
  const float* next_q;
  float* scratch;  // scratch_floats() floats, 64-byte aligned, private to the calling thread
  // Rows the kernel could not finish in fp32 (non-finite values, scores past fp32's range; see finish_tile in
  // fused_kernels.inc): their query tokens are appended at redo[(*nredo)++] (room for ntiles * tile_rows), for
  // the caller to recompute in fp64. The kernel still writes them.
  int32_t* redo;
  int32_t* nredo;
};

// One query tile of the plan.
struct TileRef {
  const int32_t* qidx;  // [rows] query tokens
  int32_t rows;         // <= tile height
  const KeyBlock* blocks;
  int64_t nblocks;
  // Residue (scattered parts): row r's own keys (tokens, ascending when the plan has no permutation) at
  // res_keys[res_off[r] .. + res_cnt[r]); each list is followed by at least one vector width of readable
  // padding (its last key repeated). res_off null: no residue.
  const int64_t* res_off;  // [rows]
  const int32_t* res_cnt;  // [rows]
  // With key passes: res_pass[r * npass + p] = end (exclusive, relative to res_off[r]) of row r's keys
  // below (p + 1) * key_pass. Null otherwise.
  const int32_t* res_pass;
};

inline constexpr int kMaxGroup = 8;  // tiles per work item at most

using TileFn = void (*)(const TileArgs&);

// The backward of one (batch, query head, query tile) (fused_backward.cpp, fused_bwd_kernels.inc). Every input is
// packed fp32 by the time it gets here, rows zero padded to whole vectors.
struct BwdTileArgs {
  int64_t D, Dv, DP, DVP;
  float qscale;  // softmax scale * log2(e): scores in base 2, as lse2
  float scale;   // softmax scale: dS = P (dP - delta) gives dQ = scale dS K and dK = scale dS^T Q
  // Q and dO of this (b, h): row t at q + t * q_ld (DP floats), dout + t * dout_ld (DVP floats).
  const float* q;
  const float* dout;
  int64_t q_ld, dout_ld;
  // Per query row t of this (b, h): lse2[t] = the forward's LSE * log2(e) (+inf for a row with no key, so its
  // P is 0), delta[t] = rowsum(dO * O).
  const float* lse2;
  const float* delta;
  // K / V of this (b, hk): row t at k + t * k_ld (DP floats), v + t * v_ld (DVP floats).
  const float* k;
  int64_t k_ld;
  const float* v;
  int64_t v_ld;
  // dK / dV accumulators (fp32, added to): key t's rows at gk + (t - key0) * DP, gv + (t - key0) * DVP; every key
  // the tile keeps lies in the accumulators' range.
  float* gk;
  float* gv;
  int32_t key0;
  // dQ of this (b, h): element (t, d) at dq[t * dq_ld + d * dq_inc], written (a query row is in one tile).
  float* dq;
  int64_t dq_ld, dq_inc;
  const struct TileRef* tile;
  const int32_t* keys;
  const uint32_t* masks;
  const int32_t* res_keys;
  float* scratch;      // bwd_scratch_floats() floats, 64-byte aligned, private to the calling thread
  int32_t* nonfinite;  // set to 1 where a dQ value written is not finite (the caller redoes the group in fp64)
};

using BwdTileFn = void (*)(const BwdTileArgs&);

// One ISA's kernel set. tile_rows: query rows per tile (a multiple of the vector width, <= 32 so a row
// mask fits a uint32). block_keys: keys per dense block the planner should emit.
struct KernelSet {
  const char* name;
  int width;       // floats per vector
  int tile_rows;   // M
  int block_keys;  // NB
  TileFn run_tile;
  // Scratch floats one thread needs for given D, Dv (groups of up to kMaxGroup tiles).
  int64_t (*scratch_floats)(int64_t D, int64_t Dv);
  BwdTileFn run_bwd_tile;  // the backward of one tile
  int64_t (*bwd_scratch_floats)(int64_t D, int64_t Dv);
};

namespace avx512 { const KernelSet& kernels(); }
namespace avx2 { const KernelSet& kernels(); }
namespace generic { const KernelSet& kernels(); }

}  // namespace spattn::cpu::fused
