// cuda/fused/fused_fwd_band.cuh — the sm_90a band kernel: plans whose rows are one band each
// (BlockPlan::band: row q keeps lo <= k - q <= hi, 0 <= k < Lk: local, sliding windows, causal), run by 64-row
// slabs over 64-key chunks.
//
// Why: a rectangular BM x 128 tile of a band visits every key that any of its BM rows keeps. local(256)'s
// rows keep 513 keys; a 128-row tile visits 640 of them a row (area / nnz 1.25), a 192-row tile 704-768.
// Here each consumer warpgroup (64 rows) multiplies only its own slab's chunks: 576 keys a row (1.12) at
// any BM, so BM = 192 at D=64 (three consumers sharing every chunk load, FA3's D=64 shape) and 128 at D=128 (two,
// FA3's D=128 shape) cost no extra area. Tiles lie in shared memory as 64-column panels (128-byte swizzle), one
// at D=64, two at D=128.
//
//   persistent CTAs, one per SM, draw work items (BM-row query tile, batch, head) from a global counter
//   warpgroup 0      producer: one thread computes the item's chunk range (the union of its slabs' ranges)
//                    and each slab's range, leaves them in the item's slot, and issues bulk tensor copies of
//                    the Q tile and of each 64-key K/V chunk into a kStages ring (at D=128 K and V with
//                    barriers of their own, K copies two chunks ahead: kSplitKV). A chunk's `empty` mbarrier
//                    expects every consumer thread; the producer arrives for the warpgroups whose slab does
//                    not use the chunk, so each consumer waits for and releases only its own chunks. Lane 0 of
//                    warps 1..C: each consumer's storer, a bulk tensor copy of every output slab it hands over.
//   warpgroups 1..C  consumers, one 64-row slab each: its chunks two at a time (one 128-key step: S as two
//                    m64n64 wgmmas, one softmax, PV over both chunks), an odd last chunk as a 64-key step;
//                    S_i issued with PV_{i-1} (FA3's intra-warpgroup pipelining); the consumers take turns at
//                    their wgmma issue (named barriers), each as many turns an item as its busiest slab has steps
//                    (slabs differ by a chunk or so at the sequence ends and on causal rows: a slab with fewer
//                    passes its last turns without work). The epilogue writes O / l into the consumer's swizzled
//                    shared buffer for its storer (band_store).
// Steps whose keys every row of the slab keeps run unmasked; the others apply the band predicate.
#pragma once
#include "cuda/fused/fused_fwd_ws.cuh"

namespace spattn::cuda::fused {

template <int BM_, int D_, bool kBf16_, bool kRunningMax_ = false, bool kShifted_ = false, bool kPrefix_ = false>
struct BandTraits {
  static constexpr int BM = BM_, D = D_, kChunk = 64;
  // A key prefix (FusedParams::band_prefix, BlockPlan::band_prefix: local(w) | global_cols(0:G), attention sinks):
  // every live slab first runs the prefix's 64-key chunks as 64-key steps (masked: the prefix's keys, and the band's
  // where it reaches into them), then its band chunks past them; one online softmax, each key visited once. An
  // instantiation of its own (plain bands only, not with running maxima or shifted windows), so that the plain
  // band's code stays as it was measured.
  static constexpr bool kPrefix = kPrefix_;
  static_assert(!(kPrefix && (kShifted_ || kRunningMax_)), "band kernel: a key prefix on plain band rows only");
  // Shifted window rows (BlockPlan::band_shifted, 1-D neighborhoods): row q keeps the W = hi - lo + 1 keys from
  // clamp(q + lo, 0, Lk - W) on, so the rows at either end keep the same window; the chunk ranges, whole chunks and
  // masks take the two clamps (first key at most Lk - W, last at least W - 1). An instantiation of its own, so
  // that the plain band's code stays as it was measured.
  static constexpr bool kShifted = kShifted_;
  // The 128-key steps after a slab's first take their exponentials against the rows' running maxima, without the
  // row-max reduction in front of them (band_softmax_running; LaunchParams::band_running_max): causal +1.4% at
  // L=4096, +3.1% at L=16384; local(256) -1.6% (its short rows: 4-5 steps), so chosen for long rows only.
  static constexpr bool kRunningMax = kRunningMax_;
  static_assert(!(kRunningMax && D != 64), "band kernel: running-max steps at head dim 64 only (band_redo_s)");
  // Their row sums as 4 partial chains (no max chain in front of them): causal +0.9% at L=16384, +0.4% at 4096
  // against 2 (same-process A/B, bench/LOG.md, session 11).
  static constexpr int kRunningParts = 4;
  static constexpr bool kBf16 = kBf16_;
  // The 128-key steps' row max and row sum over 2 partial chains each (tile_softmax's kP): causal +1.1-1.6%,
  // local +0.2-0.4% (H100, both timed in one process, bench/LOG.md, session 10; 4 partials: less).
  static constexpr int kSoftmaxParts = 2;
  // D=64: 192 rows (three consumer warpgroups, FA3's D=64 shape): 128 rows measured 10-14% slower (bench/LOG.md,
  // v14). D=128: 128 rows (two consumer warpgroups, FA3's D=128 shape: O and S of a 128-key step are 64 registers
  // each).
  static_assert((D == 64 && BM == 192) || (D == 128 && BM == 128), "band kernel: 192 rows at head dim 64, 128 at 128");
  static constexpr int kConsumers = BM / 64;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  // kOInQ (D=128, not with a key prefix: that instantiation drew C7511 with it): a slab's output is staged in the
  // slab's own Q rows (its S are done by then), not in buffers of its own: the 32 KB that frees holds a second Q
  // buffer. That Q buffer is then released by the storer once the copy has read the slab (or by the consumer, where
  // it stores nothing).
  static constexpr bool kOInQ = D == 128 && !kPrefix;
  // The next item's Q tile loads during this item's last chunks (D=64, kOInQ); else room for one Q buffer only.
  static constexpr int kQBufs = D == 64 || kOInQ ? 2 : 1;
  // Tiles are stored in panels of 64 columns (128 bytes a row, the tensor maps' 128-byte swizzle): a Q tile as
  // D / 64 panels of BM rows; each ring below as D / 64 panel rings, so that consecutive chunks of one panel lie
  // side by side at either head dim.
  static constexpr int kPanels = D / 64;
  static constexpr int kQBytes = BM * D * 2;
  static constexpr int kChunkBytes = kChunk * 128;  // one panel of a K (or V) chunk
  // A ring of kStages chunks (stage = chunk index & (kStages - 1)); K and V each have a slot more that mirrors slot
  // 0, so that the chunks of stages kStages - 1 and 0 also lie side by side: every pair of consecutive chunks is
  // one 128-key tile (one m64n128 S wgmma, PV descriptors from one base). 8 stages at D=64, 4 at D=128.
  static constexpr int kStages = D == 64 ? 8 : 4;
  static constexpr int kPanelRingBytes = (kStages + 1) * kChunkBytes;
  static constexpr int kRingBytes = kPanels * kPanelRingBytes;
  // One output slab (64 rows x D columns in 128-byte-swizzled panels) a consumer: its rows go out by one bulk
  // tensor copy a panel.
  static constexpr int kOBytes = kOInQ ? 0 : 64 * D * 2;
  static constexpr int kOPanelStride = kOInQ ? BM * 128 : 64 * 128;  // from one 64-column panel of a slab to the next
  static constexpr int kOOffset = kQBufs * kQBytes + 2 * kRingBytes;
  static constexpr int kBarOffset = kOOffset + kConsumers * kOBytes;
  // Work-item slots, one per Q buffer: id, b, h, hk, q0, first chunk, chunks, then per slab first/last chunk
  // (7-12), then the split part (13): -1 the whole item, -2 - c slab c alone (split_slabs), else part id << 4 |
  // part << 2 | (parts - 1).
  // kSplitKV (D=128): K and V have pipelines of their own. A chunk's K is released once its S is done, a step before
  // its V (released after PV), and the producer issues each K copy kVLag chunks ahead of the V copy it pairs with,
  // so that the next step's K loads while this step's PV runs. (With one full/empty pair a chunk, a ring of 4 chunks
  // held only the step in S and the step in PV: every step waited for its copies; H100, causal ran at 0.62x and
  // local(256) at 0.98x the TMA kernel's speed, bench/LOG.md.) D=64: one pair a chunk for K and V, as measured (8
  // stages hold lookahead enough; split barriers there drew C7511 in the shifted and prefix instantiations).
  static constexpr bool kSplitKV = D == 128;
  static constexpr int kVLag = 2;
  // mbarriers: full and empty per ring stage (of K and of V where split), per Q buffer, per output buffer (o_full:
  // the slab is written; o_empty: its copy has read it).
  static constexpr int kBars = (kSplitKV ? 4 : 2) * kStages + 2 * kQBufs + 2 * kConsumers;
  // Per consumer a store record (slab's first row, head, batch, kOInQ: Q buffer; batch -1: no more stores) for its
  // storer warp.
  static constexpr int kRecOffset = kBarOffset + kBars * 8;
  static constexpr int kSlotOffset = kRecOffset + kConsumers * 16;
  static constexpr int kSlotInts = 16;
  static constexpr int kSmemBytes = kSlotOffset + kQBufs * kSlotInts * 4 + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one CTA");
  // (Two consumers: 232, not FA3's 240 with a 24-register producer; at 24 the producer thread's chunk ranges spilled.)
  static constexpr int kProducerRegs = 32;
  static constexpr int kConsumerRegs = kConsumers == 2 ? 232 : 160;
  static_assert(128 * kProducerRegs + 128 * kConsumers * kConsumerRegs <= 65536, "register split");
  using Elem = typename std::conditional<kBf16, __nv_bfloat16, __half>::type;
};

namespace detail {
template <int N>
__device__ __forceinline__ float (&lower_half(float (&s)[2 * N]))[N] {
  return *reinterpret_cast<float(*)[N]>(&s[0]);
}
template <int N>
__device__ __forceinline__ float (&upper_half(float (&s)[2 * N]))[N] {
  return *reinterpret_cast<float(*)[N]>(&s[N]);
}
// `own` where kOwn, else `fallback` (own then has one element and is unused).
template <bool kOwn, int N, int M>
__device__ __forceinline__ float (&own_or(float (&own)[M], float (&fallback)[N]))[N] {
  if constexpr (kOwn) {
    static_assert(M == N, "own_or: own's size");
    return own;
  } else {
    return fallback;
  }
}
}  // namespace detail

// A 128-key step's softmax against the rows' reference maxima m (BandTraits::kRunningMax): p = 2^(s sl2 - m sl2)
// straight from the scores, without the row-max reduction in front of the exponentials (that reduction and its
// shuffles were the step's longest dependency chain). While every thread's partial row sum stays at or below 2^12
// (so every p <= 2^12: within fp16 P, and no overflow of O or of the sums) the step changes nothing else:
// alpha = 1, m kept (FlashAttention-4's lazy rescale, here without the max in front). Otherwise (the row's
// scores rose above m by ~4-12 log2 units or more) the warp rescales its rows from the exponentials:
// d = ceil(log2(max p)), p *= 2^-d, m += d / sl2, alpha = 2^-d. An exponential that overflowed (a rise of 128 log2
// units or more within one step) cannot be rescaled: it returns true, with s garbage, alpha 1 and row_max /
// row_sum untouched, and the caller runs the step again exactly (band_redo_s). Requires finite row maxima.
template <int kP>
__device__ __forceinline__ bool band_softmax_running(float (&s)[64], float (&row_max)[2], float (&row_sum)[2], float sl2,
                                                  float (&alpha)[2]) {
  using namespace detail;
  constexpr float kMaxSum = 4096.f;
  float ss[2] = {row_exp2<128, kP>(s, 0, sl2, row_max[0] * sl2), row_exp2<128, kP>(s, 1, sl2, row_max[1] * sl2)};
  alpha[0] = alpha[1] = 1.f;
  if (__any_sync(0xffffffffu, !(fmaxf(ss[0], ss[1]) <= kMaxSum))) {
    float pm[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      pm[hh] = 0.f;
#pragma unroll
      for (int j = 0; j < 16; ++j) pm[hh] = fmaxf(pm[hh], fmaxf(s[4 * j + 2 * hh], s[4 * j + 2 * hh + 1]));
      pm[hh] = fmaxf(pm[hh], __shfl_xor_sync(0xffffffffu, pm[hh], 1));
      pm[hh] = fmaxf(pm[hh], __shfl_xor_sync(0xffffffffu, pm[hh], 2));
    }
    if (__any_sync(0xffffffffu, !(fmaxf(pm[0], pm[1]) < INFINITY))) return true;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float d = pm[hh] > 1.f ? ceilf(__log2f(pm[hh])) : 0.f;  // 2^d >= max p (log2 approximate: p <= 2)
      const float a = ex2_ftz(-d);
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        s[4 * j + 2 * hh] *= a;
        s[4 * j + 2 * hh + 1] *= a;
      }
      ss[hh] *= a;
      alpha[hh] = a;
      row_max[hh] += d / sl2;
    }
  }
  row_sum[0] = row_sum[0] * alpha[0] + ss[0];
  row_sum[1] = row_sum[1] * alpha[1] + ss[1];
  return false;
}

// S of a 128-key step for this warp's 16 rows by mma.sync (the wgmma accumulator layout: 8-column block j in
// s[4j ... 4j + 3]), from the slab's Q tile at s_qs and the step's two K chunks at s_kp (side by side): the rare
// recomputation behind band_softmax_running, by one warp alone (a wgmma would need the whole warpgroup).
template <bool kBf16>
__device__ __forceinline__ void band_redo_s(float (&s)[64], uint32_t s_qs, uint32_t s_kp, int wrow, int lane) {
  using namespace detail;
  const int mat = lane >> 3;
#pragma unroll
  for (int i = 0; i < 64; ++i) s[i] = 0.f;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t qf[4];
    ldmatrix_x4(qf, s_qs + sw_off<64>(wrow + (mat & 1) * 8 + (lane & 7), 2 * kk + (mat >> 1)));
#pragma unroll
    for (int j2 = 0; j2 < 8; ++j2) {
      uint32_t bf[4];
      ldmatrix_x4(bf, s_kp + sw_off<128>((2 * j2 + (mat >> 1)) * 8 + (lane & 7), 2 * kk + (mat & 1)));
      mma16816<kBf16>(&s[(2 * j2) * 4], qf, bf[0], bf[1]);
      mma16816<kBf16>(&s[(2 * j2 + 1) * 4], qf, bf[2], bf[3]);
    }
  }
}

// A key-prefix chunk's mask (BandTraits::kPrefix): columns below `keep` (the prefix's keys in this chunk) kept in
// every row, the others by the band predicate (tile_mask_band's, with int bounds).
template <int BN>
__device__ __forceinline__ void tile_mask_band_prefix(float (&s)[BN / 2], int d0, int lo, int hi, int kvalid, int keep,
                                                      int lane) {
  const int rr = lane >> 2, cb = 2 * (lane & 3);
  unsigned first[2], width[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int row = rr + 8 * hh;
    const int a = max(min(lo - d0 + row, BN), 0) - cb;
    const int z = min(hi - d0 + row, kvalid - 1) - cb;
    first[hh] = z >= a ? unsigned(a) : 0x40000000u;
    width[hh] = z >= a ? unsigned(z - a) : 0u;
  }
  const int kb = keep - cb;  // kept in every row: c < kb
  detail::mask_fragment(s, [&](int c, int hh) { return unsigned(c) - first[hh] > width[hh] && c >= kb; });
}

// A split part's epilogue (FusedParams::split_*): this thread's O accumulators (N: D / 2), row maxima and row sums
// go to the workspace of part `us` (split_part_floats: split_floats(D) a thread of kWarps consumer warps); the warp
// then counts itself in at its (item, warp) counter. The last of the item's `parts` parts to arrive zeroes the counter (for the next launch), reads every part's values back in part
// order (its own too), merges them into o / row_max / row_sum and returns true: it stores the rows. Others return
// false. The merge order is fixed, so the result does not depend on which part finishes last.
template <int N, int kWarps>
__device__ __forceinline__ bool split_merge(const FusedParams& p, float (&o)[N], float (&row_max)[2],
                                            float (&row_sum)[2], int us, int part, int parts, int wi, int lane) {
  using namespace detail;
  constexpr int V = split_floats(2 * N) / 4;  // float4s a thread
  constexpr int NV = N / 4;                   // of O
  auto at = [&](int u) {  // this thread's float4s of part u: 32 lanes apart
    return reinterpret_cast<float4*>(p.split_ws) + (size_t(u) * kWarps + wi) * V * 32 + lane;
  };
  float4* mine = at(us);
#pragma unroll
  for (int i = 0; i < NV; ++i) __stcg(mine + 32 * i, make_float4(o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]));
  __stcg(mine + 32 * NV, make_float4(row_max[0], row_max[1], row_sum[0], row_sum[1]));
  __threadfence();
  __syncwarp();
  int* counter = p.split_count + (us / parts) * kSplitWarps + wi;
  int arrived = 0;
  if (lane == 0) arrived = atomicAdd(counter, 1);
  arrived = __shfl_sync(0xffffffffu, arrived, 0);
  if (arrived != parts - 1) return false;
  if (lane == 0) atomicExch(counter, 0);  // every part has arrived: zero for the next launch
  __threadfence();  // the other parts' values, written before their arrivals
  const float sl2 = p.scale_log2;
  float mm[2] = {-INFINITY, -INFINITY}, ms[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < N; ++i) o[i] = 0.f;
  for (int q = 0; q < parts; ++q) {  // every part from the workspace (its own too: the same order for all)
    const float4* src = at(us - part + q);
    const float4 t = __ldcg(src + 32 * NV);
    const float xm[2] = {t.x, t.y}, xs[2] = {t.z, t.w};
    float a[2], bx[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {  // max -inf: no key yet (that side contributes nothing)
      const float m_new = fmaxf(mm[hh], xm[hh]);
      a[hh] = mm[hh] == -INFINITY ? 0.f : ex2_ftz((mm[hh] - m_new) * sl2);
      bx[hh] = xm[hh] == -INFINITY ? 0.f : ex2_ftz((xm[hh] - m_new) * sl2);
      mm[hh] = m_new;
      ms[hh] = ms[hh] * a[hh] + xs[hh] * bx[hh];
    }
#pragma unroll
    for (int i = 0; i < NV; ++i) {  // float4 i: columns of rows hh = 0, 0, 1, 1
      const float4 x = __ldcg(src + 32 * i);
      o[4 * i] = o[4 * i] * a[0] + x.x * bx[0];
      o[4 * i + 1] = o[4 * i + 1] * a[0] + x.y * bx[0];
      o[4 * i + 2] = o[4 * i + 2] * a[1] + x.z * bx[1];
      o[4 * i + 3] = o[4 * i + 3] * a[1] + x.w * bx[1];
    }
  }
  row_max[0] = mm[0], row_max[1] = mm[1], row_sum[0] = ms[0], row_sum[1] = ms[1];
  return true;
}

// The epilogue of slab c: O / l as 16-bit values into the warpgroup's output buffer s_o in the tensor map's
// 128-byte swizzle (16-byte group j of row r at (j / 8) * kOPanelStride + r * 128 + ((j % 8) ^ (r & 7)) * 16:
// panels of 64 columns), then the slab's coordinates into
// its store record and an arrival on o_full: the storer warp of this consumer (in the producer warpgroup) issues
// the bulk tensor copy (rows past Lq dropped by the copy) and arrives on o_empty once the copy has read the buffer.
// Measured: the per-thread global stores of tile_store cost ~12% of local(256)'s time (a build without them ran
// 317-321 vs 281-286 TFLOP/s at L=4096). The copy is not issued here: the tensor map's address (a generic
// address of a kernel parameter) in the consumers tipped ptxas into serializing their wgmmas (C7511). LSE, if
// asked for, by the threads directly. `stores`: this warpgroup's earlier slabs (o_empty's phase).
// Returns whether the slab went to the storer (kOInQ: which then releases the Q buffer qb).
template <class Tr>
__device__ __forceinline__ bool band_store(const FusedParams& p, const float (&o)[Tr::D / 2], const float (&row_max)[2],
                                           const float (&row_sum)[2], int b, int h, int qs, int c, uint32_t s_o,
                                           uint32_t o_full, uint32_t o_empty, uint32_t rec, unsigned& stores,
                                           int lane, int wtid, int qb) {
  using namespace detail;
  if (qs >= p.q_len) return false;  // a slab wholly past the end (the last query tile's)
  const int rr = ((wtid >> 5) << 4) + (lane >> 2);  // this thread's first row in the slab (second: + 8)
  float inv[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int tok = qs + rr + 8 * hh;
    inv[hh] = row_finish(p, row_sum[hh], row_max[hh], b, h, tok, (lane & 3) == 0 && tok < p.q_len);
  }
  if (stores > 0) mbar_wait(o_empty, int((stores - 1) & 1));  // the previous slab's copy has read the buffer
  ++stores;
  stage_o_swizzled<Tr::D, Tr::kBf16, Tr::kOPanelStride>(s_o, o, inv, wtid >> 5, lane);
  fence_proxy_async();  // the generic-proxy writes, before the async proxy's copy reads them
  named_sync(1 + c, 128);
  if (wtid == 0) {
    st_shared_s32(rec, qs);
    st_shared_s32(rec + 4, h);
    st_shared_s32(rec + 8, b);
    if constexpr (Tr::kOInQ) st_shared_s32(rec + 12, qb);
    mbar_arrive(o_full);
  }
  return true;
}

// A consumer's storer (lane 0 of warp 1 + c of the producer warpgroup): bulk tensor copies of each slab the
// consumer hands over (band_store; one a 64-column panel), until a record with batch -1.
// kOInQ: the slab lies in Q buffer qb (the record's fourth word) at s_o (its place in buffer 0) + qb * kQBytes; once
// read, the storer arrives on that buffer's q_empty for the consumer's 128 threads.
template <class Tr>
__device__ __forceinline__ void band_storer(const FusedParams& p, uint32_t s_o, uint32_t o_full, uint32_t o_empty,
                                            uint32_t rec, uint32_t q_empty) {
  using namespace detail;
  for (unsigned n = 0;; ++n) {
    mbar_wait(o_full, int(n & 1));
    const int qs = ld_shared_s32(rec), h = ld_shared_s32(rec + 4), b = ld_shared_s32(rec + 8);
    if (b < 0) break;
    const int qb = Tr::kOInQ ? ld_shared_s32(rec + 12) : 0;
    const uint32_t so = s_o + uint32_t(qb) * Tr::kQBytes;
#pragma unroll
    for (int pn = 0; pn < Tr::kPanels; ++pn) tma_store_4d(&p.tmap_o, so + uint32_t(pn) * Tr::kOPanelStride, 64 * pn, qs, h, b);
    bulk_commit();
    bulk_wait_all<true>();
    mbar_arrive(o_empty);
    if constexpr (Tr::kOInQ) mbar_arrive_n(q_empty + 8 * qb, 128u);
  }
  bulk_wait_all<false>();  // the copies have completed before the CTA exits
}

template <class Tr>
__device__ __forceinline__ void fused_fwd_band_body(const FusedParams& p) {
  using namespace detail;
  constexpr int BM = Tr::BM, D = Tr::D, S = Tr::kStages, C = Tr::kConsumers, NQ = Tr::kQBufs;
  constexpr int CB = Tr::kChunkBytes, P = Tr::kPanels, PRB = Tr::kPanelRingBytes;
  static_assert((S & (S - 1)) == 0, "ring index arithmetic by masks");
  constexpr bool kBf16 = Tr::kBf16;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t s_q = smem_u32(smem);               // NQ query tiles
  // K ring: stage s of panel pn at s_k0 + pn * kPanelRingBytes + s * kChunkBytes (+ mirror)
  const uint32_t s_k0 = s_q + NQ * Tr::kQBytes;
  const uint32_t s_v0 = s_k0 + Tr::kRingBytes;       // V ring, the same
  // Ring stage st's barriers: K full / empty at bar_kfull / bar_kempty + 8 st, V's at bar_vfull / bar_vempty
  // (kSplitKV; else K's stand for both).
  constexpr bool kSplit = Tr::kSplitKV;
  const uint32_t bar_kfull = s_q + Tr::kBarOffset, bar_kempty = bar_kfull + 8 * S;
  const uint32_t bar_vfull = kSplit ? bar_kempty + 8 * S : bar_kfull, bar_vempty = kSplit ? bar_vfull + 8 * S : bar_kempty;
  const uint32_t bar_qfull = bar_kfull + 8 * S * (kSplit ? 4 : 2), bar_qempty = bar_qfull + 8 * NQ;
  const uint32_t bar_ofull = bar_qempty + 8 * NQ, bar_oempty = bar_ofull + 8 * C;
  const uint32_t slots = s_q + Tr::kSlotOffset;  // work-item slots (ints)
  // Consumer c's output slab for an item in Q buffer qb: its own buffer, or (kOInQ) the slab's Q rows.
  auto slab_out = [&](int qb, int c) {
    return Tr::kOInQ ? s_q + uint32_t(qb) * Tr::kQBytes + uint32_t(c) * 64 * 128
                     : s_q + Tr::kOOffset + uint32_t(c) * Tr::kOBytes;
  };

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  const int bh_count = p.batch * p.q_heads;
  const int items = p.q_tiles * bh_count;
  const int work = p.split_first + (items - p.split_first) * p.split_k;  // work ids (split parts counted)
  const int lo = p.band_lo, hi = p.band_hi;
  // The rows' first and last keys: first(q) = min(max(q + lo, 0), fmax), last(q) = max(min(q + hi, Lk - 1), lmin);
  // plain bands: clamps that never bind (rows past the band's reach keep nothing: first > last).
  const int fmax = Tr::kShifted ? p.k_len - (hi - lo + 1) : p.k_len, lmin = Tr::kShifted ? hi - lo : -1;

  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(bar_kfull + 8 * s, 1);         // the producer's expect_tx; completes on the bytes
      mbar_init(bar_kempty + 8 * s, 128 * C);  // every consumer thread (the producer stands in for non-users)
      if constexpr (kSplit) {
        mbar_init(bar_vfull + 8 * s, 1);
        mbar_init(bar_vempty + 8 * s, 128 * C);
      }
    }
    for (int s = 0; s < NQ; ++s) {
      mbar_init(bar_qfull + 8 * s, 1);
      mbar_init(bar_qempty + 8 * s, 128 * C);
    }
    for (int c = 0; c < C; ++c) {
      mbar_init(bar_ofull + 8 * c, 1);
      mbar_init(bar_oempty + 8 * c, 1);
    }
    fence_mbar_init();
  }
  __syncthreads();

  if (wg == 0) {
    // ---- producer ----
    setmaxnreg_dec<Tr::kProducerRegs>();
    if (tid == 0) {
      unsigned gk = 0, gv = 0;  // K and V chunks loaded so far
      for (int nq = 0;; ++nq) {
        const int qb = nq % NQ;
        if (nq >= NQ) mbar_wait(bar_qempty + 8 * qb, ((nq / NQ) - 1) & 1);
        const int u = p.persistent ? atomicAdd(p.work_counter, 1) : (nq == 0 ? int(blockIdx.x) : work);
        const uint32_t sl = slots + qb * Tr::kSlotInts * 4;
        auto put = [&](int i, int v) { st_shared_s32(sl + 4 * i, v); };
        auto get = [&](int i) { return ld_shared_s32(sl + 4 * i); };
        if (u >= work) {
          put(0, -1);
          mbar_arrive(bar_qfull + 8 * qb);
          if (p.persistent) work_counter_done(p.work_counter);
          break;
        }
        // Work id u: item u, or past split_first part (u - split_first) % split_k of item split_first + (u -
        // split_first) / split_k (a contiguous range of the item's chunks).
        const int us = u - p.split_first;
        const int w = us < 0 ? u : p.split_first + us / p.split_k;
        const int part = us < 0 ? 0 : us % p.split_k, nparts = us < 0 ? 1 : p.split_k;
        const bool slab_part = us >= 0 && p.split_slabs;  // part `part` is slab `part` alone
        const WorkItem wi = section_item(w, p.q_tiles, bh_count, p.head_section, p.order);
        const int qt = wi.tile, bh = wi.unit;
        const int b = bh / p.q_heads, h = bh % p.q_heads, hk = h / p.group, q0 = qt * BM;
        // Each slab's chunks: keys first(first row) ... last(last row) (both rise with the row); empty: first > last.
        // kPrefix: the band's chunks past the prefix's pc (in every part); live: the slabs this work id runs.
        int cf = 0x7fffffff, cl = -1, live = 0;
        const int pc = Tr::kPrefix ? (p.band_prefix + 63) >> 6 : 0;
#pragma unroll
        for (int c = 0; c < C; ++c) {
          const int qs = q0 + 64 * c, qe = min(qs + 63, p.q_len - 1);
          int a = max(0, qs + lo), z = min(p.k_len - 1, qe + hi);
          if constexpr (Tr::kShifted) a = min(a, fmax), z = max(z, lmin);
          if constexpr (Tr::kPrefix) {
            a = max(a, 64 * pc);
            live |= qs < p.q_len && (!slab_part || c == part) ? 1 << c : 0;
          }
          int f = 1, l = 0;
          if (qs < p.q_len && a <= z && (!slab_part || c == part)) {
            f = a >> 6, l = z >> 6;
            cf = min(cf, f), cl = max(cl, l);
          }
          put(7 + 2 * c, f);
          put(8 + 2 * c, l);
        }
        if (nparts > 1 && cl >= 0 && !slab_part) {  // this part's share of the item's chunks (possibly none), and each slab's
          const int n = cl - cf + 1;
          const int pf = cf + (n * part) / nparts;
          cl = cf + (n * (part + 1)) / nparts - 1;
          cf = pf;
#pragma unroll
          for (int c = 0; c < C; ++c) {
            put(7 + 2 * c, max(cf, get(7 + 2 * c)));
            put(8 + 2 * c, min(cl, get(8 + 2 * c)));
          }
        }
        // kPrefix: the prefix's chunks first (the item's first part only, where a slab is live), then the band's.
        const int npre = Tr::kPrefix && live && (nparts == 1 || slab_part || part == 0) ? pc : 0;
        const int nch = npre + (cl >= cf ? cl - cf + 1 : 0);
        if constexpr (Tr::kPrefix) put(14, npre), put(15, live);
        put(0, w), put(1, b), put(2, h), put(3, hk), put(4, q0), put(5, cf), put(6, nch);
        put(13, nparts == 1 ? -1 : slab_part ? -2 - part : (us << 4) | (part << 2) | (nparts - 1));
        if (nch == 0) {
          mbar_arrive(bar_qfull + 8 * qb);
          continue;
        }
        mbar_expect_tx(bar_qfull + 8 * qb, Tr::kQBytes);
#pragma unroll
        for (int pn = 0; pn < P; ++pn)
          tma_load_4d(s_q + qb * Tr::kQBytes + pn * BM * 128, &p.tmap_q, bar_qfull + 8 * qb, 64 * pn, q0, h, b);
        // Chunk j of the item: K (kv 1), V (kv 2) or both (kv 3, one pair of barriers) into ring stage g % S (and
        // the mirror after stage S - 1), once that stage's previous chunk is released; the producer arrives for the
        // slabs that do not use the chunk.
        auto load = [&](int j, unsigned g, int kv) {
          const int st = int(g % S);
          const uint32_t full = (kv == 2 ? bar_vfull : bar_kfull) + 8 * st;
          const uint32_t empty = (kv == 2 ? bar_vempty : bar_kempty) + 8 * st;
          if (g >= unsigned(S)) mbar_wait(empty, int((g / S) - 1) & 1);
          const int x = Tr::kPrefix ? (j < npre ? j : cf + j - npre) : cf + j;
          const uint32_t off = uint32_t(st) * CB;
          mbar_expect_tx(full, (st == 0 ? 2 * CB : CB) * P * (kv == 3 ? 2 : 1));
#pragma unroll
          for (int pn = 0; pn < P; ++pn) {
            const uint32_t pr = uint32_t(pn) * PRB;  // the panel's rings
            if (kv & 1) tma_load_4d(s_k0 + pr + off, &p.tmap_k, full, 64 * pn, x * 64, hk, b);
            if (kv & 2) tma_load_4d(s_v0 + pr + off, &p.tmap_v, full, 64 * pn, x * 64, hk, b);
            if (st == 0) {  // the mirrors after stage S - 1
              if (kv & 1) tma_load_4d(s_k0 + pr + S * CB, &p.tmap_k, full, 64 * pn, x * 64, hk, b);
              if (kv & 2) tma_load_4d(s_v0 + pr + S * CB, &p.tmap_v, full, 64 * pn, x * 64, hk, b);
            }
          }
          int users = 0;
#pragma unroll
          for (int c = 0; c < C; ++c)
            users += (Tr::kPrefix && j < npre ? (live >> c) & 1 : (get(7 + 2 * c) <= x && x <= get(8 + 2 * c))) ? 1 : 0;
          // This phase of `empty` began when the wait above returned: the arrivals count for chunk g.
          if (users < C) mbar_arrive_n(empty, 128u * unsigned(C - users));
        };
        if constexpr (kSplit) {
          for (int j = 0; j < nch + Tr::kVLag; ++j) {  // K of chunk j, then V of chunk j - kVLag
            if (j < nch) load(j, gk++, 1);
            if (j >= Tr::kVLag) load(j - Tr::kVLag, gv++, 2);
          }
        } else {
          for (int j = 0; j < nch; ++j) load(j, gk++, 3);
        }
      }
    } else if (lane == 0 && warp <= C) {  // warps 1..C: the consumers' storers
      const int c = warp - 1;
      band_storer<Tr>(p, slab_out(0, c), bar_ofull + 8 * c, bar_oempty + 8 * c, s_q + Tr::kRecOffset + 16 * c,
                      bar_qempty);
    }
  } else {
    // ---- consumers ----
    setmaxnreg_inc<Tr::kConsumerRegs>();
    const int c = __shfl_sync(0xffffffffu, wg - 1, 0);  // slab: rows 64c ... 64c + 63 of the item (warp-uniform)
    const int r0 = (warp - 4) * 16 + (lane >> 2);  // this thread's first row in the item (second: +8)
    const float sl2 = p.scale_log2;
    const uint32_t o_full = bar_ofull + 8 * c, o_empty = bar_oempty + 8 * c, rec = s_q + Tr::kRecOffset + 16 * c;
    unsigned stores = 0;  // slabs handed to the storer
    // Low descriptor words of the K and V rings' slot 0 (see desc_lo): a chunk's descriptors are these plus offsets.
    // V's leading byte offset: from one 64-column panel to the next (its panel rings; unused at D=64).
    const uint32_t k_lo = desc_lo(s_k0, 16), v_lo = desc_lo(s_v0, P == 1 ? 64 * 128 : PRB);
    unsigned g = 0;  // chunks of the items before this one
    // The consumers take turns at their S / PV issue, in the order 0, 1, ..., C - 1 (named barriers C + 1 ...
    // 2C; 1 ... C are band_store's): one consumer's softmax runs under the others' wgmmas.
    const Turns turns{C + 1, C, c};
    turns.start();
    for (int nq = 0;; ++nq) {
      const int qb = nq % NQ;
      mbar_wait(bar_qfull + 8 * qb, (nq / NQ) & 1);
      // This consumer is done with Q buffer qb: after its last S (q_done), or with kOInQ at the item's end where it
      // stores nothing (q_free; else the storer releases the buffer once its copy has read the slab).
      auto q_done = [&] {
        if constexpr (!Tr::kOInQ) mbar_arrive(bar_qempty + 8 * qb);
      };
      auto q_free = [&] {
        if constexpr (Tr::kOInQ) mbar_arrive(bar_qempty + 8 * qb);
      };
      const uint32_t sl = slots + qb * Tr::kSlotInts * 4;
      auto get = [&](int i) { return ld_shared_s32(sl + 4 * i); };
      if (get(0) < 0) {
        if ((tid & 127) == 0) {  // no more slabs: the storer stops
          if (stores > 0) mbar_wait(o_empty, int((stores - 1) & 1));
          st_shared_s32(rec + 8, -1);
          mbar_arrive(o_full);
        }
        break;
      }
#ifdef SPATTN_TRACE
      const unsigned long long t_start = globaltimer_ns();
      const int get_item = get(0);
      // the event's index now (its latency hidden by the item), the event at the item's end
      const unsigned trace_i = p.trace != nullptr && (tid & 127) == 0 ? atomicAdd(reinterpret_cast<unsigned*>(p.trace), 1u) : 0u;
#endif
      // Read before the Q buffer is released: the producer then refills this slot with the item after next.
      const int b = get(1), h = get(2), q0 = get(4), cf = get(5), nch = get(6), split = get(13);
      const int sf = get(7 + 2 * c), sle = get(8 + 2 * c);
      const int m = sle >= sf ? sle - sf + 1 : 0;  // this slab's chunks
      // kPrefix: the prefix's chunks this slab runs first (64-key steps), at ring index g on; its band's after them.
      const int npre = Tr::kPrefix ? get(14) : 0, live = Tr::kPrefix ? get(15) : 0;
      const int mp = (live >> c) & 1 ? npre : 0;
      // Every consumer takes as many turns an item as the item's busiest slab has S issues ((chunks + 1) / 2, and
      // a prefix's chunks one each), the ones past its own without work, so that the turn order stays the same
      // across items.
      int n_turns = 0;
#pragma unroll
      for (int x = 0; x < C; ++x) {
        const int fx = get(7 + 2 * x), lx = get(8 + 2 * x);
        n_turns = max(n_turns, (lx >= fx ? (lx - fx + 2) >> 1 : 0) + ((live >> x) & 1 ? npre : 0));
      }
      const unsigned jp = Tr::kPrefix ? __shfl_sync(0xffffffffu, g, 0) : 0u;  // ring index of the prefix's first chunk
      // Ring index of its first chunk, broadcast from lane 0 so that the compiler knows it is warp-uniform:
      // the chunk descriptors are then computed in uniform registers (no per-descriptor R2UR).
      const unsigned j0 = __shfl_sync(0xffffffffu, g + unsigned(npre) + unsigned(sf - cf), 0);
      g += unsigned(nch);
      float o[D / 2];
#pragma unroll
      for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
      float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
      if (m == 0 && mp == 0) {
        q_done();
      } else {
        float sacc[64];
        uint32_t pa[8][4];
        const uint32_t s_qs = s_q + uint32_t(qb) * Tr::kQBytes + uint32_t(c) * 64 * 128;  // the slab's Q rows
        const uint32_t q_lo = desc_lo(s_qs, 16);
        // Descriptors of 16-column slice kk of the slab's Q rows and of ring stage st's K chunk (kk / 4: the panel).
        auto q_desc = [&](int kk) { return desc_of_lo(q_lo + (kk >> 2) * (BM * 8) + (kk & 3) * 2); };
        auto k_desc = [&](unsigned st, int kk) {
          return desc_of_lo(k_lo + st * (CB >> 4) + unsigned(kk >> 2) * (PRB >> 4) + unsigned(kk & 3) * 2);
        };
        const int qs = q0 + 64 * c, qe = min(qs + 63, p.q_len - 1);
        const int kp0 = sf * 64;  // key of the slab's first chunk
        auto ring = [&](int j) { return (j0 + unsigned(j)) & unsigned(S - 1); };
        // Chunk j's K (V) landed; released (K once its S is done, V once its PV is). Without kSplitKV, K's barriers
        // stand for both: wait_k waits for both, release_k does nothing and release_v releases both.
        auto wait_k = [&](int j) { mbar_wait(bar_kfull + 8 * ring(j), int(((j0 + unsigned(j)) / S) & 1)); };
        auto wait_v = [&](int j) {
          if constexpr (kSplit) mbar_wait(bar_vfull + 8 * ring(j), int(((j0 + unsigned(j)) / S) & 1));
        };
        auto release_k = [&](int j) {
          if constexpr (kSplit) mbar_arrive(bar_kempty + 8 * ring(j));
        };
        auto release_v = [&](int j) { mbar_arrive(bar_vempty + 8 * ring(j)); };
        // S of chunks j, j + 1 (W = 128; their K chunks lie side by side, see kRingBytes) or of chunk j (W = 64).
        auto issue_s = [&](auto& s, int j) {
          constexpr int W = sizeof(s) / sizeof(float) * 2;
#pragma unroll
          for (int kk = 0; kk < D / 16; ++kk)
            wgmma::Op<W, kBf16>::ss(s, q_desc(kk), k_desc(ring(j), kk), kk > 0 ? 1 : 0);
        };
        // O += P V over W keys from chunk j on; pa: W / 16 fragments of P.
        auto issue_pv = [&](auto w_c, int j) {
          constexpr int W = decltype(w_c)::value;
#pragma unroll
          for (int kk = 0; kk < W / 16; ++kk) wgmma::Op<D, kBf16>::rs_tb(o, pa[kk], desc_of_lo(v_lo + ring(j) * (CB >> 4) + 128 * kk), 1);
        };
        // The slab's chunks u0 ... u0 + un that every row of the slab keeps whole: from the first at or past key
        // first(qe) to the last ending at or before last(qs) (floor divisions by shifts; none: u0 past any chunk).
        // 32-bit bounds: lo / hi are clamped to [-Lq, Lk] and Lq + Lk < 2^30 (band_kernel_applies).
        int u0 = max(0, ((Tr::kShifted ? min(qe + lo, fmax) : qe + lo) - kp0 + 63) >> 6);
        const int u1 = Tr::kShifted ? (max(min(qs + hi, p.k_len - 1), lmin) - 63 - kp0) >> 6
                                    : (min(qs + hi - 63, p.k_len - 64) - kp0) >> 6;
        const unsigned un = u1 >= u0 ? unsigned(u1 - u0) : 0u;
        if (u1 < u0) u0 = 1 << 30;
        // The band predicate on chunk jj of the slab (32 accumulator columns), unless every row keeps all of it.
        auto mask_chunk = [&](float(&s)[32], int jj) {
          if (unsigned(jj - u0) > un) {
            const int kp = kp0 + 64 * jj;
            if constexpr (Tr::kShifted)  // first kept column at most fmax - kp, last at least lmin - kp
              tile_mask_band<64, int>(s, kp - q0 - (r0 & ~15), lo, hi, p.k_len - kp, lane, min(fmax - kp, 64), max(lmin - kp, -1));
            else
              tile_mask_band<64, int>(s, kp - q0 - (r0 & ~15), lo, hi, p.k_len - kp, lane);
          }
        };
        using W64 = std::integral_constant<int, 64>;
        using W128 = std::integral_constant<int, 128>;
        float alpha[2];
        float(&s_lo)[32] = lower_half<32>(sacc);
        float(&s_hi)[32] = upper_half<32>(sacc);
        auto mask_pair = [&](int jj) {
          mask_chunk(s_lo, jj);
          mask_chunk(s_hi, jj + 1);
        };
        auto p64 = [&]() -> uint32_t(&)[4][4] { return *reinterpret_cast<uint32_t(*)[4][4]>(&pa[0]); };
        if constexpr (Tr::kPrefix) {
          // The prefix's chunks (keys 64i ... 64i + 63, ring index jp + i): 64-key steps before the band's, masked
          // to the prefix's keys and the band's where it reaches into them. (The same sequence as the odd last
          // chunk's step below, kept apart: one lambda for both, its parts passed as lambdas, made ptxas serialize
          // the prefix kernels' wgmmas, C7511.)
          for (int i = 0; i < mp; ++i) {
            const int jc = int(jp + unsigned(i) - j0);  // the chunk's index relative to the band's first (wraps below)
            const unsigned st = ring(jc);
            wait_k(jc);
            fence_regs(s_lo);
            turns.wait();
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk)
              wgmma::Op<64, kBf16>::ss(s_lo, q_desc(kk), k_desc(st, kk), kk > 0 ? 1 : 0);
            wgmma_commit();
            turns.pass();
            wgmma_wait<0>();
            fence_regs(s_lo);
            release_k(jc);
            if (m == 0 && i == mp - 1) q_done();  // no band step: every S of the item done
            const int kp = 64 * i;
            tile_mask_band_prefix<64>(s_lo, kp - q0 - (r0 & ~15), lo, hi, p.k_len - kp, p.band_prefix - kp, lane);
            tile_softmax<64>(s_lo, row_max, row_sum, sl2, alpha);
            tile_rescale<D>(o, alpha);
            tile_to_p<64, kBf16>(s_lo, p64());
            wait_v(jc);
            fence_regs(o);
            fence_regs(pa);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 64 / 16; ++kk)
              wgmma::Op<D, kBf16>::rs_tb(o, pa[kk], desc_of_lo(v_lo + st * (CB >> 4) + 128 * kk), 1);
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(o);
            release_v(jc);
          }
        }
        const int np = m >> 1;
        if (np > 0) {
          // chunks 0 and 1: S only
          wait_k(0);
          wait_k(1);
          fence_regs(sacc);
          turns.wait();
          wgmma_fence();
          issue_s(sacc, 0);
          wgmma_commit();
          turns.pass();
          wgmma_wait<0>();
          fence_regs(sacc);
          if constexpr (!Tr::kRunningMax) {  // (running maxima: a step later, see below)
            release_k(0);
            release_k(1);
          }
          mask_pair(0);
          tile_softmax<128, Tr::kSoftmaxParts>(sacc, row_max, row_sum, sl2, alpha);
          // kPrefix: O already holds the prefix's chunks (without a prefix it is 0 here: nothing to rescale).
          if constexpr (Tr::kPrefix)
            if (mp > 0) tile_rescale<D>(o, alpha);
          tile_to_p<128, kBf16>(sacc, pa);
          // kRunningMax: every row of the warp has a key (a finite maximum) after the first step; else the exact step.
          bool running = Tr::kRunningMax && __all_sync(0xffffffffu, row_max[0] != -INFINITY && row_max[1] != -INFINITY);
          for (int t = 1; t < np; ++t) {
            const int j = 2 * t;
            wait_v(j - 2);
            wait_v(j - 1);
            wait_k(j);
            wait_k(j + 1);
            fence_regs(sacc);
            fence_regs(o);
            fence_regs(pa);
            turns.wait();
            wgmma_fence();
            issue_s(sacc, j);
            wgmma_commit();
            issue_pv(W128{}, j - 2);
            wgmma_commit();
            turns.pass();
            wgmma_wait<1>();  // S done; the previous PV may still run
            fence_regs(sacc);
            mask_pair(j);
            // kRunningMax: the step's exponentials against the rows' running maxima (band_softmax_running), or the
            // exact step where a row has no key yet. Where an exponential overflowed (alpha then 1, row_max / row_sum
            // untouched), the step once more at the end: S again, masked, the exact softmax. (Arranged so that the
            // common path stays as without the redo and ptxas keeps the wgmmas pipelined: the redo before the PV
            // wait, or the exact step after it, drew C7511 or ran 1-3% slower; the redo as a loop spilled.)
            bool redo = false;
            if (running) {
              redo = band_softmax_running<Tr::kRunningParts>(sacc, row_max, row_sum, sl2, alpha);
            } else {
              tile_softmax<128, Tr::kSoftmaxParts>(sacc, row_max, row_sum, sl2, alpha);
              if constexpr (Tr::kRunningMax)
                running = __all_sync(0xffffffffu, row_max[0] != -INFINITY && row_max[1] != -INFINITY);
            }
            wgmma_wait<0>();
            fence_regs(o);
            fence_regs(pa);
            // K of chunks j, j + 1 (S done), a step before their V; with running maxima the step before's, since the
            // redo below reads this step's K again.
            release_v(j - 2);
            release_v(j - 1);
            release_k(Tr::kRunningMax ? j - 2 : j);
            release_k(Tr::kRunningMax ? j - 1 : j + 1);
            tile_rescale<D>(o, alpha);
            tile_to_p<128, kBf16>(sacc, pa);
            if constexpr (Tr::kRunningMax) {
              if (redo) {  // S again by mma.sync (this warp alone; the PV is done, its registers free)
                band_redo_s<kBf16>(sacc, s_qs, s_k0 + ring(j) * CB, (warp & 3) * 16, lane);
                mask_pair(j);
                tile_softmax<128, Tr::kSoftmaxParts>(sacc, row_max, row_sum, sl2, alpha);
                tile_rescale<D>(o, alpha);
                tile_to_p<128, kBf16>(sacc, pa);
              }
            }
          }
          if (!(m & 1)) q_done();  // every S of the item done: the Q buffer is free
          wait_v(2 * np - 2);
          wait_v(2 * np - 1);
          fence_regs(o);
          fence_regs(pa);
          wgmma_fence();
          issue_pv(W128{}, 2 * np - 2);
          wgmma_commit();
          wgmma_wait<0>();
          fence_regs(o);
          release_v(2 * np - 2);
          release_v(2 * np - 1);
          if constexpr (Tr::kRunningMax) {
            release_k(2 * np - 2);
            release_k(2 * np - 1);
          }
        }
        if (m & 1) {  // an odd last chunk: a 64-key step on its own
          const int j = 2 * np;
          // Its scores: the lower half of the 128-key steps' at D=64; registers of their own at D=128, where sharing
          // them made ptxas serialize the kernel's wgmmas (C7511).
          float s_own[D == 128 ? 32 : 1];
          float(&s1)[32] = own_or<D == 128>(s_own, s_lo);
          wait_k(j);
          fence_regs(s1);
          turns.wait();
          wgmma_fence();
          issue_s(s1, j);
          wgmma_commit();
          turns.pass();
          wgmma_wait<0>();
          fence_regs(s1);
          release_k(j);
          q_done();
          mask_chunk(s1, j);
          tile_softmax<64>(s1, row_max, row_sum, sl2, alpha);
          tile_rescale<D>(o, alpha);
          tile_to_p<64, kBf16>(s1, p64());
          wait_v(j);
          fence_regs(o);
          fence_regs(pa);
          wgmma_fence();
          issue_pv(W64{}, j);
          wgmma_commit();
          wgmma_wait<0>();
          fence_regs(o);
          release_v(j);
        }
      }
      for (int t = mp + ((m + 1) >> 1); t < n_turns; ++t) {  // the busiest slab's turns past this slab's own
        turns.wait();
        turns.pass();
      }
#ifdef SPATTN_TRACE
      const unsigned long long t_pre = globaltimer_ns();
#endif
      if (split <= -2) {
        if (c != -2 - split) {  // a slab part: only its own slab's warpgroup stores
          q_free();
          continue;
        }
      } else if (split >= 0) {
        // A part over the keys merges per warp (each warp's last part to arrive, possibly in different CTAs for
        // the warps of one slab), so it stores per warp, directly.
        if (split_merge<D / 2, 4 * C>(p, o, row_max, row_sum, split >> 4, (split >> 2) & 3, (split & 3) + 1, warp - 4, lane))
          tile_store<D, typename Tr::Elem, kBf16>(p, o, row_max, row_sum, b, h, q0, r0, 2 * (lane & 3), lane);
        q_free();
        continue;
      }
      if (!band_store<Tr>(p, o, row_max, row_sum, b, h, q0 + 64 * c, c, slab_out(qb, c), o_full, o_empty, rec, stores,
                          lane, tid & 127, qb))
        q_free();
#ifdef SPATTN_TRACE
      const unsigned long long t_end = globaltimer_ns();
      if (p.trace != nullptr && (tid & 127) == 0 && trace_i < kTraceEvents) {
        unsigned long long* e = p.trace + 4 + 4 * size_t(trace_i);
        e[0] = unsigned(get_item) | (unsigned long long)c << 32 | (unsigned long long)smid() << 40 |
               (unsigned long long)(split & 0xffff) << 48;
        e[1] = t_start, e[2] = t_pre, e[3] = t_end;
      }
#endif
    }
    turns.finish();  // absorb the last hand-over of the turn
  }
}

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1) fused_fwd_band_kernel(const __grid_constant__ FusedParams p) {
#ifdef __CUDA_ARCH__
  if constexpr (!kWgmmaAvailable) {
    __trap();
  } else {
    fused_fwd_band_body<Tr>(p);
  }
#endif
}

}  // namespace spattn::cuda::fused
