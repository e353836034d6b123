// cuda/fused/fused_fwd_ws.cuh — the warp-specialized TMA forward kernel (sm_90a), FlashAttention-3's shape:
//
//   persistent CTAs, one per SM, draw work items (query tile, batch, head) from a global counter
//   warpgroup 0      producer: one thread issues bulk tensor copies (TMA) of each item's Q tile and of each
//                    K/V tile of its list into a kStages ring; `full` mbarriers complete on the copies'
//                    byte count, `empty` mbarriers on the consumers' release; it runs ahead into the next
//                    item. setmaxnreg gives its registers to the consumers.
//   warpgroups 1..C  consumers, 64 query rows each (BM = 64 C): S_i = Q K_i^T issued together with
//                    O += P_{i-1} V_{i-1} (intra-warpgroup pipelining), the S issues of the C warpgroups
//                    taking turns on named barriers (one warpgroup's softmax runs under another's wgmma).
//
// The copy engine computes the addresses and zero-fills rows past the sequence end, so no consumer thread
// spends an issue slot on loads; K/V are shared by C warpgroups (half or a third of the L2 traffic of the
// one-warpgroup 64-row CTA). Applies to plans without permutation (perm_d == 1: rows are contiguous tokens)
// and tensors whose strides suit a tensor map (FusedFwd::to_params checks; else the cp.async kernels run).
//
// The epilogue (WsTraits::kTmaEpi, issue 40): O staged in the Q buffer and stored by bulk tensor copies from the
// producer warpgroup (ws_stage_o, ws_storer), the LSE by the threads; the Q buffer is then released by the consumers'
// last S and the copies' read. Where o admits no tensor map, 128-row plans run on the cp.async kernel instead
// (FusedFwd::to_params); 192-row tiles have no cp.async row, so their instantiation without it (each thread stores
// its O pairs, tile_store) is kept for that case only.
#pragma once
#include "cuda/fused/fused_fwd.cuh"

namespace spattn::cuda::fused {

// kTmaEpi_ (issue 40): the epilogue stages O / l in the consumer's rows of its item's Q buffer (free once the item's
// last S is done) by stmatrix, and a storer thread of the producer warpgroup writes them with bulk tensor copies
// through o's tensor map (FusedParams::tmap_o: rows past Lq dropped), then adds its arrival on that buffer's q_empty;
// the consumer goes on with its next item. false (192-row tiles whose o admits no tensor map only: launch_ws): each
// thread stores its O pairs (tile_store).
template <int BM_, int BN_, int D_, bool kBf16_, bool kTmaEpi_ = true>
struct WsTraits {
  static constexpr int BM = BM_, BN = BN_, D = D_;
  static constexpr bool kBf16 = kBf16_, kTmaEpi = kTmaEpi_;
  static_assert(kTmaEpi || BM == 192, "the threads' stores: 192-row tiles only (128-row plans run on cp.async)");
  static_assert(BM == 128 || BM == 192, "warp-specialized query tile: 2 or 3 consumer warpgroups");
  static_assert(BN == 128, "warp-specialized key tile: 128");
  static_assert(D == 64 || (D == 128 && BM == 128), "head dim 64 (128 with two consumer warpgroups)");
  static constexpr int kConsumers = BM / 64;
  // D=128: the key-tile loop with the lazy rescale and the softmax kept under the previous P V, P packed inside the
  // softmax's block (pipelined_tiles' kLazy): +3.9-4.7% on the windows table's three D=128 cases (H200, bf16), the
  // early pack 1.5% more on the six D=128 cases (bench/LOG.md, session 26). D=64 keeps the plain loop (this loop
  // there: 0.994-1.014 of its time on six D=64 cases, one process, H200; bench/LOG.md, session 28).
  static constexpr bool kLazy = D == 128;
  static constexpr int kEmptyArrivals = 128 * kConsumers;  // every consumer thread releases a K/V stage
  static constexpr int kThreads = 128 * (kConsumers + 1);
  // D=64: 4 K/V stages and two query-tile buffers (the next item's Q loads during this item's last tiles);
  // D=128: 3 stages and one buffer (224 KB).
  static constexpr int kStages = D == 64 ? 4 : 3;
  static constexpr int kQBufs = D == 64 ? 2 : 1;
  static constexpr int kQBytes = BM * D * 2;
  static constexpr int kTileBytes = BN * D * 2;
  static constexpr int kBarOffset = kQBufs * kQBytes + kStages * 2 * kTileBytes;
  // Work-item descriptors, one per Q buffer (16 ints: id, b, h, hk, q0, n, e_begin lo/hi, first entry).
  static constexpr int kSlotOffset = kBarOffset + (2 * kStages + 2 * kQBufs) * 8;
  static constexpr int kSlotInts = 16;
  // kTmaEpi: an o_full mbarrier per (Q buffer, consumer): the consumer's rows of that buffer hold its O (the storer
  // reads the item from the buffer's slot). One per buffer, so that no phase completes twice before the storer sees it.
  static constexpr int kEpiOffset = kSlotOffset + kQBufs * kSlotInts * 4;
  static constexpr int kEpiBytes = kTmaEpi ? kQBufs * kConsumers * 8 : 0;
  static constexpr int kSmemBytes = kEpiOffset + kEpiBytes + 1024;  // + alignment slack
  // Registers a thread after setmaxnreg (FA3's split): the sum over the CTA stays within 64 K.
  static constexpr int kProducerRegs = kConsumers == 2 ? 24 : 32;
  static constexpr int kConsumerRegs = kConsumers == 2 ? 240 : 160;
  static_assert(128 * kProducerRegs + 128 * kConsumers * kConsumerRegs <= 65536, "register split");
  using Elem = typename std::conditional<kBf16, __nv_bfloat16, __half>::type;
};

// kTmaEpi, consumer c's epilogue: LSE by the threads, O / l into the consumer's 64 rows of the Q buffer at s_o (its
// last S done: nothing reads them again this item), then o_full for its storer.
template <class Tr>
__device__ __forceinline__ void ws_stage_o(const FusedParams& p, const float (&o)[Tr::D / 2], const float (&row_max)[2],
                                           const float (&row_sum)[2], int b, int h, int qs, int c, uint32_t s_o,
                                           uint32_t o_full, int wq, int lane) {
  using namespace detail;
  const int rr = (wq << 4) + (lane >> 2);  // this thread's first row of the 64 (second: + 8)
  float inv[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int tok = qs + rr + 8 * hh;
    inv[hh] = row_finish(p, row_sum[hh], row_max[hh], b, h, tok, (lane & 3) == 0 && tok < p.q_len);
  }
  stage_o_swizzled<Tr::D, Tr::kBf16, Tr::BM * 128>(s_o, o, inv, wq, lane);
  fence_proxy_async();  // the generic-proxy writes, before the async proxy's copy reads them
  named_sync(1 + Tr::kConsumers + c, 128);
  if (wq == 0 && lane == 0) mbar_arrive(o_full);
}

// kTmaEpi, consumer c's storer (lane 0 of warp 1 + c, in the producer warpgroup): for each item, in order, once the
// consumer's O is in Q buffer qb, bulk tensor copies of its 64 rows (a copy a 64-column panel; rows past Lq dropped by
// the map), and once they have read the buffer, its one arrival on that buffer's q_empty (the consumers arrive
// themselves after their last S). The item's slot says which rows: the producer writes it before the buffer's q_full
// and rewrites it only after its q_empty, and the storer waits on both itself (q_full has completed by then: the
// consumer's o_full follows it), so that every write and read of the slot is ordered by a barrier directly.
// The copies' tensor map is read here, not in the consumers (band_store: a kernel parameter's generic address in the
// consumers tipped ptxas into serializing their wgmmas, C7511).
template <class Tr>
__device__ __forceinline__ void ws_storer(const FusedParams& p, uint32_t s_q, uint32_t slots, uint32_t o_full0,
                                          uint32_t bar_qfull, uint32_t bar_qempty, int c) {
  using namespace detail;
  constexpr int NQ = Tr::kQBufs, C = Tr::kConsumers;
  for (unsigned n = 0;; ++n) {
    const int qb = int(n % NQ);
    mbar_wait(o_full0 + 8 * (qb * C + c), int((n / NQ) & 1));
    mbar_wait(bar_qfull + 8 * qb, int((n / NQ) & 1));  // done (it cannot complete again before our q_empty arrival)
    const uint32_t sl = slots + qb * Tr::kSlotInts * 4;
    if (ld_shared_s32(sl) < 0) break;
    const int b = ld_shared_s32(sl + 4), h = ld_shared_s32(sl + 8), qs = ld_shared_s32(sl + 16) + 64 * c;
    if (qs < p.q_len) {
      const uint32_t so = s_q + qb * Tr::kQBytes + c * 64 * 128;
#pragma unroll
      for (int pn = 0; pn < Tr::D / 64; ++pn) tma_store_4d(&p.tmap_o, so + pn * Tr::BM * 128, 64 * pn, qs, h, b);
      bulk_commit();
      bulk_wait_all<true>();
    }
    mbar_arrive(bar_qempty + 8 * qb);
  }
  bulk_wait_all<false>();  // the copies have completed before the CTA exits
}

template <class Tr>
__device__ __forceinline__ void fused_fwd_ws_body(const FusedParams& p) {
  using namespace detail;
  constexpr int BM = Tr::BM, BN = Tr::BN, D = Tr::D, S = Tr::kStages, C = Tr::kConsumers, NQ = Tr::kQBufs;
  constexpr bool kBf16 = Tr::kBf16;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t s_q = smem_u32(smem);                // NQ query tiles
  const uint32_t s_kv0 = s_q + NQ * Tr::kQBytes;      // stage s: K at s_kv0 + 2s*tile, V right after
  const uint32_t bar_full = s_q + Tr::kBarOffset, bar_empty = bar_full + 8 * S;
  const uint32_t bar_qfull = bar_empty + 8 * S, bar_qempty = bar_qfull + 8 * NQ;

  // The producer decodes each work item (its id, then order[] and row_offsets[] and the first entry: dependent
  // global loads) and leaves the result here for the consumers, who would otherwise wait on that chain at the
  // start of every item.
  const uint32_t slots = s_q + Tr::kSlotOffset;
  const uint32_t o_full0 = s_q + Tr::kEpiOffset;  // kTmaEpi: o_full of (Q buffer qb, consumer c) at + 8 (qb C + c)

  // warp through a lane-0 shuffle: warp-uniform to the compiler, so the wgmma descriptors derived from it (each
  // consumer warpgroup's rows) stay in uniform registers, with no R2UR before every wgmma.
  const int tid = threadIdx.x, warp = __shfl_sync(0xffffffffu, tid >> 5, 0), lane = tid & 31, wg = warp >> 2;
  const int bh_count = p.batch * p.q_heads;
  const int items = p.q_tiles * bh_count;  // work items (query tile, batch, head), most work first
  // Persistent CTAs with a dynamic scheduler: the producer takes the next work item from a global counter
  // (FusedParams::work_counter, zero at launch: work_counter_done) and hands its id to the consumers with its query
  // tile (slot + `qfull` mbarrier; -1 ends the walk). The K/V ring and the query-tile buffers run on across
  // items, so the producer loads the next item's tiles while the consumers finish (and store) the current one,
  // and an SM that drew short items draws more (longformer's global rows are 20x the local ones).
  struct Item {
    int b, h, hk, q0, n;
    int64_t e_begin;
  };
  auto item = [&](int w) {
    Item it;
    const WorkItem wi = section_item(w, p.q_tiles, bh_count, p.head_section, p.order);
    const int qt = wi.tile, bh = wi.unit;
    it.b = bh / p.q_heads, it.h = bh % p.q_heads, it.hk = it.h / p.group;
    it.q0 = qt * BM;
    it.e_begin = p.row_offsets[qt];
    it.n = int(p.row_offsets[qt + 1] - it.e_begin);
    return it;
  };

  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(bar_full + 8 * s, 1);         // the producer's expect_tx; completes on the bytes
      mbar_init(bar_empty + 8 * s, Tr::kEmptyArrivals);  // every consumer thread done with the stage
    }
    for (int s = 0; s < NQ; ++s) {
      mbar_init(bar_qfull + 8 * s, 1);        // item id written (and its Q tile landed)
      // every consumer thread done with the item's Q (and its slot); kTmaEpi: and every storer's copies with its O
      mbar_init(bar_qempty + 8 * s, 128 * C + (Tr::kTmaEpi ? C : 0));
    }
    if constexpr (Tr::kTmaEpi) {
      for (int s = 0; s < NQ * C; ++s) mbar_init(o_full0 + 8 * s, 1);  // the consumer's O staged
    }
    fence_mbar_init();
  }
  __syncthreads();

  if (wg == 0) {
    // ---- producer ----
    setmaxnreg_dec<Tr::kProducerRegs>();
    if (tid == 0) {
      unsigned g = 0;  // key tiles loaded so far
      // Tile j of item `it` into the ring (its stage once the consumers released the tile S before).
      auto load_kv = [&](const Item& it, int j) {
        const int st = int(g % S);
        if (g >= unsigned(S)) mbar_wait(bar_empty + 8 * st, int((g / S) - 1) & 1);
        const int k0 = (__ldg(&p.entries[it.e_begin + j].x) & kKtMask) * BN;
        const uint32_t sk = s_kv0 + uint32_t(st) * 2 * Tr::kTileBytes;
        const uint32_t full = bar_full + 8 * st;
        mbar_expect_tx(full, 2 * Tr::kTileBytes);
#pragma unroll
        for (int c = 0; c < D / 64; ++c) {
          tma_load_4d(sk + c * BN * 128, &p.tmap_k, full, 64 * c, k0, it.hk, it.b);
          tma_load_4d(sk + Tr::kTileBytes + c * BN * 128, &p.tmap_v, full, 64 * c, k0, it.hk, it.b);
        }
        ++g;
      };
      // Persistent: the next item from the counter. Otherwise one item a CTA (grid = items).
      auto draw = [&](int nq) {
        return p.persistent ? atomicAdd(p.work_counter, 1) : (nq == 0 ? int(blockIdx.x) : items);
      };
      for (int nq = 0;; ++nq) {
        const int qb = nq % NQ;
        int w = 0, j = 0;  // the item; its tiles loaded
        Item it{};
        // kTmaEpi with one Q buffer: it comes free only once the storers have read the O staged in it, after the
        // epilogue; the item's Q on its way to L2 and its first S tiles loaded before that wait (their stages wait on
        // earlier items' tiles only). With two buffers the wait is on the item before last, and the Q load goes first
        // (the tiles' stages wait on the current item's last tiles).
        constexpr bool kEarly = Tr::kTmaEpi && NQ == 1;
        if constexpr (kEarly) {
          w = draw(nq);
          if (w < items) {
            it = item(w);
            if (it.n > 0) {
#pragma unroll
              for (int c = 0; c < D / 64; ++c) tma_prefetch_4d(&p.tmap_q, 64 * c, it.q0, it.h, it.b);
            }
            for (; j < it.n && j < S; ++j) load_kv(it, j);
          }
        }
        if (nq >= NQ) mbar_wait(bar_qempty + 8 * qb, ((nq / NQ) - 1) & 1);
        if constexpr (!kEarly) w = draw(nq);
        const uint32_t sl = slots + qb * Tr::kSlotInts * 4;
        auto put = [&](int i, int v) { st_shared_s32(sl + 4 * i, v); };
        if (w >= items) {
          put(0, -1);
          mbar_arrive(bar_qfull + 8 * qb);
          if (p.persistent) work_counter_done(p.work_counter);
          break;
        }
        if constexpr (!kEarly) it = item(w);
        put(0, w), put(1, it.b), put(2, it.h), put(3, it.hk), put(4, it.q0), put(5, it.n);
        put(6, int(it.e_begin & 0xffffffff)), put(7, int(it.e_begin >> 32));
        if (it.n > 0) {
          const int4 e0 = __ldg(&p.entries[it.e_begin]);
          put(8, e0.x), put(9, e0.y), put(10, e0.z), put(11, e0.w);
        }
        if (it.n == 0) {
          mbar_arrive(bar_qfull + 8 * qb);
          continue;
        }
        mbar_expect_tx(bar_qfull + 8 * qb, Tr::kQBytes);
#pragma unroll
        for (int c = 0; c < D / 64; ++c)
          tma_load_4d(s_q + qb * Tr::kQBytes + c * BM * 128, &p.tmap_q, bar_qfull + 8 * qb, 64 * c, it.q0, it.h, it.b);
        for (; j < it.n; ++j) load_kv(it, j);
      }
    } else if constexpr (Tr::kTmaEpi) {
      if (lane == 0 && warp >= 1 && warp <= C) ws_storer<Tr>(p, s_q, slots, o_full0, bar_qfull, bar_qempty, warp - 1);
    }
  } else {
    // ---- consumers ----
    setmaxnreg_inc<Tr::kConsumerRegs>();
    const int c = wg - 1;                                 // consumer index: query rows 64c ... 64c + 63
    const int r0 = (warp - 4) * 16 + (lane >> 2);         // this thread's first row in the tile (second: +8)
    const int cb = 2 * (lane & 3);                        // first column in each 8-wide block
    const Turns turns{1, C, c};  // named barriers 1 ... C ordering the S issues
    const float sl2 = p.scale_log2;
    turns.start();  // consumer 0 takes the first turn
    unsigned g = 0;  // key tiles consumed before the current item
    for (int nq = 0;; ++nq) {
      const int qb = nq % NQ;
      mbar_wait(bar_qfull + 8 * qb, (nq / NQ) & 1);
      const uint32_t sl = slots + qb * Tr::kSlotInts * 4;
      auto get = [&](int i) { return ld_shared_s32(sl + 4 * i); };
      if (get(0) < 0) {
        if constexpr (Tr::kTmaEpi) {
          if (tid % 128 == 0) mbar_arrive(o_full0 + 8 * (qb * C + c));  // the storer ends too
        }
        break;
      }
      Item it;
      it.b = get(1), it.h = get(2), it.hk = get(3), it.q0 = get(4), it.n = get(5);
      it.e_begin = int64_t(unsigned(get(6))) | (int64_t(get(7)) << 32);
      const int4 e_first = make_int4(get(8), get(9), get(10), get(11));
      const int n = it.n, q0 = it.q0;
      float o[D / 2];
#pragma unroll
      for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
      float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
      if (n == 0) {
        mbar_arrive(bar_qempty + 8 * qb);  // kTmaEpi: the buffer's O rows then wait on the storers' arrivals too
      } else {
        auto stage_k = [&](int i) { return s_kv0 + uint32_t((g + unsigned(i)) % S) * 2 * Tr::kTileBytes; };
        pipelined_tiles<BM, BN, D, kBf16, Tr::kTileBytes>(
            p, n, s_q + qb * Tr::kQBytes + c * 64 * 128, q0, r0, cb, sl2, o, row_max, row_sum,
            [&] { return e_first; }, [&](int i) { return __ldg(&p.entries[it.e_begin + i]); },
            [&](int i) { mbar_wait(bar_full + 8 * ((g + unsigned(i)) % S), int(((g + unsigned(i)) / S) & 1)); },
            stage_k,
            [&](int i) { mbar_arrive(bar_empty + 8 * ((g + unsigned(i)) % S)); },
            [&] { turns.wait(); }, [&] { turns.pass(); },
            // every S of this item is done: the producer may reuse the Q buffer
            [&] { mbar_arrive(bar_qempty + 8 * qb); }, std::bool_constant<Tr::kLazy>{});
        g += unsigned(n);
      }
      if constexpr (Tr::kTmaEpi) {
        ws_stage_o<Tr>(p, o, row_max, row_sum, it.b, it.h, q0 + 64 * c, c, s_q + qb * Tr::kQBytes + c * 64 * 128,
                       o_full0 + 8 * (qb * C + c), warp & 3, lane);
      } else {
        tile_store<D, typename Tr::Elem, kBf16>(p, o, row_max, row_sum, it.b, it.h, q0, r0, cb, lane);
      }
    }
    turns.finish();  // absorb the last hand-over of the turn
  }
}

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1) fused_fwd_ws_kernel(const __grid_constant__ FusedParams p) {
#ifdef __CUDA_ARCH__
  if constexpr (!kWgmmaAvailable) {
    __trap();
  } else {
    fused_fwd_ws_body<Tr>(p);
  }
#endif
}

}  // namespace spattn::cuda::fused
