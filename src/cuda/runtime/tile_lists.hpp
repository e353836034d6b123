// cuda/runtime/tile_lists.hpp — the tile lists of packed documents (run-time masks, documents kind), written on the
// device at every call from cu_seqlens into a fused plan's fixed-capacity arrays (cuda/fused/fused_fwd.hpp,
// DevicePlan): no host synchronisation, no host work proportional to the mask, capturable in a CUDA graph.
//
// For query tile qt (block_m rows) the entries are the key tiles (block_n keys, ascending) that hold a kept pair:
// queries q of document d keep the keys k of d with lo <= k - q <= hi (the static spec's band, document-local; dense:
// offsets past every row's reach). A tile whose queries and keys all lie in one document is kFull (every pair in the
// band) or kBand {lo, hi} (the band is translation invariant, so document offsets cancel); any other tile is a bitmask
// whose index is the entry's own (the masks array holds one bitmask a possible entry), filled by a second kernel.
// Plain data, no CUDA header.
#pragma once
#include <cstdint>

namespace spattn::cuda::runtime {

struct DocTileArgs {
  const void* cu = nullptr;  // cu_seqlens [n + 1]: int32 (cu_bits 32) or int64, stride cu_stride elements
  int cu_bits = 32;
  int64_t cu_stride = 1;
  // cu_seqlens_k [n + 1], the keys' boundaries (null: cu's). The spec is evaluated in document coordinates: within
  // document d, lo <= (k - cu_k[d]) - (q - cu[d]) <= hi, so its band is shifted by cu_k[d] - cu[d] there.
  const void* cu_k = nullptr;
  int cu_k_bits = 32;
  int64_t cu_k_stride = 1;
  int documents = 0;  // n
  int q_len = 0, k_len = 0;
  int block_m = 128, block_n = 128;
  int q_tiles = 0;
  int lo = 0, hi = 0;           // band offsets, clamped to [-(q_len + 1), k_len + 1]
  int64_t entry_capacity = 0;   // entries (and bitmasks) the arrays hold: tiles past it are dropped (never at plan sizes)
  int64_t* row_offsets = nullptr;  // [q_tiles + 1]
  int* entries = nullptr;          // int4 {kt, mask, lo, hi} a entry
  unsigned long long* masks = nullptr;  // [entry_capacity * block_m * block_n / 64]
};

// Enqueues the two kernels (lists, then bitmasks) on `stream` (a cudaStream_t). Returns the launch's cudaError_t.
int launch_document_tiles(const DocTileArgs& a, void* stream);
// The backward's key-major lists of the same documents (cuda/backward/tile_backward.hpp, DeviceLists): per key tile
// (block_n keys) the 64-row query tiles whose band reaches it, ascending (entry.x the query tile), kFull / kBand inside
// one document, else a transposed bitmask of the entry's own index (word c: key c's bits over the 64 queries; the
// masks array holds block_n words an entry). `a`'s q_tiles / row_offsets / entries / masks are the key-major plan's
// (q_tiles: key tiles; block_m 64: the query tile); order is the identity, written at plan time.
int launch_document_key_tiles(const DocTileArgs& a, void* stream);

// The most entries a query tile can have with one set of boundaries (the arrays' capacity is q_tiles times this): the
// key tiles its band spans.
inline int64_t document_tiles_per_row(int block_m, int block_n, int lo, int hi, int64_t k_tiles) {
  const int64_t span = int64_t(block_m) - 1 + int64_t(hi) - int64_t(lo);  // keys from q0 + lo to q1 - 1 + hi
  const int64_t t = span / block_n + 2;
  return t < k_tiles ? t : k_tiles;
}
// The most entries all `tiles` outer tiles (of `inner` possible partners each) can have for n documents with separate
// query and key boundaries: each (document, outer tile) pair spans at most `per_row` (document_tiles_per_row) inner
// tiles (its band, shifted), and there are at most tiles + n such pairs. With one set of boundaries tiles x per_row
// holds (the band of a tile's rows spans per_row whatever their documents).
inline int64_t document_entries(int64_t tiles, int64_t inner, int64_t per_row, int64_t n, bool separate_keys) {
  const int64_t dense = tiles * inner, banded = (separate_keys ? tiles + n : tiles) * per_row;
  return banded < dense ? banded : dense;
}

// Block masks (BlockTileArgs; FlexAttention's layout, blocks of block_m x block_n = the tiles): one list a (batch,
// head) of the mask (`lists` = B' x H', list l = b' H' + h'), its query tiles' entries at entries[l * list_capacity ...]
// and its row offsets at row_offsets[l * (q_tiles + 1) ...] (absolute entry indices: each list's launch reads its own
// slice). A query tile's entries are its listed key blocks, ascending: full blocks kFull; partial blocks kFull without a
// spec, else (the spec's band lo..hi) kFull / kBand / dropped as the band covers all, some or none of the tile. Indices
// outside [0, k_tiles) are dropped (the fast path trusts the mask otherwise: a repeat is run twice by the one-CTA
// builds, once by the grid builds).
struct BlockTileArgs {
  const void* num = nullptr;  // kv_num_blocks [B', H', NQ], element strides num_s[3]; bits 32 or 64
  const void* idx = nullptr;  // kv_indices [B', H', NQ, C], strides idx_s[4]
  const void* full_num = nullptr;  // optional, same form (null: none)
  const void* full_idx = nullptr;
  int num_bits = 32, idx_bits = 32, full_num_bits = 32, full_idx_bits = 32;
  int64_t num_s[3] = {0, 0, 0}, idx_s[4] = {0, 0, 0, 0}, full_num_s[3] = {0, 0, 0}, full_idx_s[4] = {0, 0, 0, 0};
  int heads = 1;  // H' (list l is (l / H', l % H'))
  int cap = 0, full_cap = 0;  // C and the full list's C
  int lists = 1;
  int q_len = 0, k_len = 0, block_m = 128, block_n = 128, q_tiles = 0, k_tiles = 0;
  int band = 0, lo = 0, hi = 0;  // band != 0: partial blocks keep lo <= k - q <= hi
  int64_t list_capacity = 0;     // entries a list holds (q_tiles x k_tiles)
  int64_t* row_offsets = nullptr;
  int* entries = nullptr;
};

// Enqueues the lists' kernel (a CTA a list) on `stream`. Returns the launch's cudaError_t.
int launch_block_tiles(const BlockTileArgs& a, void* stream);
// The backward's key-major lists of the same mask (cuda/backward/tile_backward.hpp, DeviceLists): `a` as for the
// forward but block_m 64 (the backward's query tile; the mask's query blocks stay q_block rows, 64 or 128: q_blocks of
// them; its key blocks are the key tiles) and row_offsets the column offsets, k_tiles + 1 a list; list_capacity 64-row
// query tiles x k_tiles.
int launch_block_key_tiles(const BlockTileArgs& a, int q_blocks, int q_block, void* stream);
// The same lists built across the grid (the default; launch_block_key_tiles above is the one-CTA build it replaced,
// kept for the A/B: SPATTN_RT_KEY_LISTS=bwd, device_runner.cpp; =cta the forward's one-CTA build too). Four
// launches: the listed blocks mark bits of two planes (partial, full: tile_walk.hpp, block_mark_word) by a warp a
// query block; a warp a key tile counts its entries from its marks; a CTA a list scans the counts into the column
// offsets and orders the key tiles most entries first, ties ascending (as plan/key_plan.cpp's static key-major plans);
// a warp a key tile writes its entries (ascending query tiles: key_word_entries) and clears its marks, so the marks
// are zero between calls (zeroed once when allocated). A block listed twice in a row is run once here (the one-CTA
// builds ran it twice); valid masks list none twice. Work O(listed blocks + lists x k_tiles x q_blocks / 32), where
// the one-CTA build read every slot of the mask's index tensors (q_blocks x (C + full C)) on one SM.
struct BlockKeyScratch {
  unsigned* marks = nullptr;   // lists x 2 x rows x words, zero between calls
  int* counts = nullptr;       // lists x rows
  int32_t* order = nullptr;    // lists x rows: each list's key tiles, most entries first (the backward's)
  int64_t words = 0;           // (bits a row + 31) / 32: (q_blocks + 31) / 32 key-major
};
int launch_block_key_tiles_grid(const BlockTileArgs& a, int q_blocks, int q_block, const BlockKeyScratch& s,
                                void* stream);
// The forward's lists (launch_block_tiles') built the same way: a row of marks a query tile, a bit a key tile
// (words: (k_tiles + 31) / 32; counts q_tiles a list; s.order unused), each query tile's entries ascending
// (row_word_entries). The forward's scratch is its own: a forward and a backward may run on two streams at once.
int launch_block_tiles_grid(const BlockTileArgs& a, const BlockKeyScratch& s, void* stream);
// The most key tiles the order's sort takes (a CTA's shared memory); past it the order is the identity.
inline constexpr int kMaxOrderedKeyTiles = 4096;

// Top-k keys (TopkTileArgs): one list a batch element (topk_indices [B, Lq, K], shared by the heads). Every pair (q, k)
// the row lists (or the spec's band keeps, lo <= k - q <= hi) sets its bit in the forward bitmask of tile (q / 128,
// k / 128) (row-major, 128 x 128) and in the backward's transposed bitmask of tile (k / 128, q / 64) (word k % 128, bit
// q % 64), and flags both tiles; the lists then hold the flagged tiles, ascending, each a bitmask entry whose index is
// the tile's own (every possible tile has a bitmask: q_tiles x k_tiles of them a list). A key listed twice sets one bit.
struct TopkTileArgs {
  const void* idx = nullptr;  // [B, Lq, K] (strides idx_s), bits 32 or 64; -1 (any negative) or >= k_len: ignored
  int idx_bits = 32;
  int64_t idx_s[3] = {0, 0, 0};
  int topk = 0;
  int lists = 1;  // B
  int q_len = 0, k_len = 0;
  int band = 0, lo = 0, hi = 0;  // band != 0: the spec's keys too
  int q_tiles = 0, k_tiles = 0, q_tiles64 = 0;  // 128-row tiles (forward), 128-key tiles, 64-row tiles (backward)
  unsigned long long* masks = nullptr;  // forward: lists x q_tiles x k_tiles bitmasks of 256 words
  unsigned long long* key_masks = nullptr;  // backward: lists x k_tiles x q_tiles64 bitmasks of 128 words (may be null)
  unsigned char* flags = nullptr;      // forward tiles' flags, lists x q_tiles x k_tiles
  unsigned char* key_flags = nullptr;  // backward's, lists x k_tiles x q_tiles64
  int64_t* row_offsets = nullptr;      // lists x (q_tiles + 1)
  int* entries = nullptr;              // lists x q_tiles x k_tiles
  int64_t* key_offsets = nullptr;      // lists x (k_tiles + 1)
  int* key_entries = nullptr;          // lists x k_tiles x q_tiles64
};

// Clears the bitmasks and flags, sets the pairs' bits and writes the lists: the forward's where masks is set, the
// backward's where key_masks is set (each pass writes its own: another call's forward may run between the two).
// Returns the launches' cudaError_t.
int launch_topk_tiles(const TopkTileArgs& a, void* stream);

// dK / dV of one kv head under grouped-query attention from per-query-head partials: dst[b, k, 0, d] = the sum over g
// of src[g][b][k][d] (fp32 sums, stored once in dst's dtype). src: `group` contiguous [batch, len, dim] arrays of the
// backward's per-query-head launches; dst: a [batch, len, 1, dim] view (element strides dst_s: batch, row, dim).
struct GroupSumArgs {
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t dst_s[3] = {0, 0, 1};
  int group = 1, batch = 1, len = 0, dim = 0;
  int bf16 = 1;  // 1: bfloat16, 0: float16
};
int launch_group_sum(const GroupSumArgs& a, void* stream);

}  // namespace spattn::cuda::runtime
