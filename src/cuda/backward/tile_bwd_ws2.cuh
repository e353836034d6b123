// cuda/backward/tile_bwd_ws2.cuh — the warp-specialized backward with 128 queries a step (head dim 64, sm_90a):
// tile_bwd_ws.cuh's structure (producer warp, dQ-writer warp, two consumer warpgroups of 64 keys) over steps of
// TWO of the plan's 64-query entries of the key tile, as FA3 / FA4 run head dim 64 (128 x 128 tiles). A step's
// fixed costs (mbarrier waits, the dS^T barrier, wgmma fences and waits, entry reads) are paid once per 128
// queries instead of once per 64, and its wgmmas are twice as wide (S^T, dP^T: 64 keys x 128 queries a warpgroup;
// dV, dK: K = 128 queries; dQ: each warpgroup the 64 queries of its half over all 64 columns, K = 128 keys).
//
//   step i: query head hk * group + i / np, entries 2 (i % np) and 2 (i % np) + 1 of the key tile (np = ceil(ne/2)
//   pairs a head); an odd key tile's last pair has an empty second half: the first half's query tile loaded again
//   under an empty band (P = 0, so dS = 0 and nothing reaches dK, dV), and the writer adds nothing for it.
//   Registers a consumer thread: S^T 64 + dP^T 64 + dK 32 + dV 32 (+ dQ 32 after S^T and dP^T are packed).
//   dQ staging: one buffer a warpgroup (64 x 64 fp32, in its register order: tile_bwd.cuh's ws accumulator order with
//   kDQ = 64), freed by the writer once its bulk reads are done (a step ahead of its reuse).
// Two grids, for this step and tile_bwd_ws.cuh's (D = 128): a CTA a key tile (tile_bwd_ws_body), and the persistent
// one (tile_bwd_ws_persist_body, traits Persistent<SmemEpilogue<...>>: CTAs an SM taking key tiles from a counter),
// which tile_backward.cu launches where dK / dV go out through shared memory and the lists have an item counter.
#pragma once
#include "cuda/backward/tile_bwd_ws.cuh"

namespace spattn::cuda::bwd {

template <bool kBf16_>
struct BwdWs2Traits {
  static constexpr int BM = 128, BN = 128, D = 64, kThreads = 384, kConsumerThreads = 256;
  static constexpr bool kBf16 = kBf16_;
  static constexpr int kStages = 2;
  static constexpr int kDQ = D;  // dQ columns of a consumer warpgroup (its 64 queries)
  static constexpr int kKV = BN * D * 2, kQ = BM * D * 2, kDS = BN * BM * 2, kHalfDS = kDS / 2;
  static constexpr int kDQStage = 64 * kDQ * 4;
  static constexpr int kOffV = kKV, kOffStage = 2 * kKV;  // stage s: Q at kOffStage + 2 s kQ, dO after it
  static constexpr int kOffDS = kOffStage + kStages * 2 * kQ;  // two dS^T buffers (step parity), two halves each
  static constexpr int kOffDQ = kOffDS + 2 * kDS;              // [consumer warpgroup] staged dQ
  static constexpr int kOffRows = kOffDQ + 2 * kDQStage;       // stage s, half c: lse2 (64) then delta (64)
  static constexpr int kOffBar = kOffRows + kStages * 2 * BM * 4;  // full[S], empty[S], dq_full[2], dq_empty[2]
  static constexpr int kStepBytes = 2 * kQ + 2 * BM * 4;
  static constexpr int kOffEnt = kOffBar + (2 * kStages + 4) * 8;  // stage s's two entries: 32 bytes at + 32 s
  static constexpr int kSmemBytes = kOffEnt + 32 * kStages + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  using Elem = typename std::conditional<kBf16, __nv_bfloat16, __half>::type;
  using Half = BwdWsTraits<64, kBf16>;  // a half step: 64 queries (mask_step, store_ds)
};

// The steps of item w (key tile, batch, kv head): 128 queries a step (two entries), ceil(ne / 2) x group; 64,
// n = ne x group. The CTA's step count g = g0 + i runs on across a persistent CTA's items (the ring's stage and phase,
// the dS^T buffer, the staged dQ's phases).
template <class Tr>
__device__ __forceinline__ int ws_steps(const BwdParams& p, const detail::KeyTileWork& w) {
  return Tr::BM == 128 ? (w.ne + 1) / 2 * p.group : w.n;
}

// The producer thread on item w: the two halves' Q, dO rows (64 each) and their lse2, delta; returns the step count
// after them.
template <class Tr>
  requires(Tr::BM == 128)
__device__ __forceinline__ int ws_produce(const BwdParams& p, const WsSmem<Tr>& sm, const detail::KeyTileWork& w,
                                          int g0) {
  using namespace detail;
  constexpr int S = Tr::kStages;
  const int b = w.b, ne = w.ne;
  const int64_t e0 = w.e0;
  int g = g0, h = w.hk * p.group;
  // the head's first plan-space row, stepped a head at a time (its 64-bit product per head kept ptxas at 24
  // registers with 2 spilled)
  int64_t rows = (int64_t(b) * p.q_heads + h) * p.qp;
  for (int hl = p.group; hl > 0; --hl, ++h, rows += p.qp) {
    for (int j = 0; j < ne; j += 2, ++g) {
      const int st = g % S;
      if (g >= S) mbar_wait(sm.empty + 8 * st, ((g / S) - 1) & 1);
      const uint32_t bar = sm.full + 8 * st;
      // the pair (half 1 past ne: half 0's query tile under an empty band), stored before the arrival
      int4 ea[2];
      ea[0] = __ldg(&p.entries[e0 + j]);
      ea[1] = j + 1 == ne ? make_int4(ea[0].x, -2, 1, 0) : __ldg(&p.entries[e0 + j + 1]);
      st_shared_v4b32(sm.ent(st), ea[0]);
      st_shared_v4b32(sm.ent(st) + 16, ea[1]);
      mbar_expect_tx(bar, Tr::kStepBytes);
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int q0 = ea[c].x * 64;
        tma_load_4d(sm.q(st) + c * 64 * 128, &p.tmap_q, bar, 0, q0, h, b);
        tma_load_4d(sm.d_o(st) + c * 64 * 128, &p.tmap_do, bar, 0, q0, h, b);
        bulk_load(sm.rows(st) + c * 512, p.lse2 + rows + q0, 64 * 4, bar);
        bulk_load(sm.rows(st) + c * 512 + 256, p.delta + rows + q0, 64 * 4, bar);
      }
    }
  }
  return g;
}

// The dQ writer thread on item w: half c's 64 x 64 (consumer warpgroup c's) into its query tile's accumulator; returns
// the step count after them.
template <class Tr>
  requires(Tr::BM == 128)
__device__ __forceinline__ int ws_write_dq(const BwdParams& p, const WsSmem<Tr>& sm, const detail::KeyTileWork& w,
                                           int g0) {
  using namespace detail;
  const int b = w.b, hk = w.hk, ne = w.ne;
  const int64_t e0 = w.e0;
  int g = g0;
  for (int h = hk * p.group; h < (hk + 1) * p.group; ++h) {
    float* acc_h = p.dq_acc + (int64_t(b) * p.q_heads + h) * p.qp * Tr::D;
    for (int j = 0; j < ne; j += 2, ++g) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        mbar_wait(sm.dqfull + 8 * c, g & 1);
        if (j + c < ne) {
          bulk_reduce_add_f32(acc_h + int64_t(__ldg(&p.entries[e0 + j + c]).x) * 64 * Tr::D, sm.dq(c), Tr::kDQStage);
          bulk_commit();
          bulk_wait_all<true>();
        }
        mbar_arrive(sm.dqempty + 8 * c);
      }
    }
  }
  return g;
}

// The persistent consumer's own index in the consumer warpgroups (ct in [0, 256)), from %tid.x read again (an opaque
// read: not hoisted, so not kept live across the steps, where the consumers have no register to spare).
__device__ __forceinline__ int ws2_consumer_index() {
  int tx;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tx));
  return tx - 128;
}

// The consumer step (session 27, bench/LOG.md): the step's two entries come from the producer through shared memory
// (stored into the stage's slot, half 1 already padded, before the stage's arrival; two LDS.128 after the full wait),
// its masks are built between the S^T / dP^T issue and the S^T wait, a full entry's mask words are left unset and the
// dS^T stmatrix lane offset stays in a register; its last three products run in FA3's / FA4's order (dv_ds_dq_dk:
// dV, dS^T and the barrier, then dQ and dK as two groups, dQ staged while dK runs). Against the step that read the
// next pair of entries from global memory a step ahead and issued dV and dK as one group before the barrier, waiting
// for all three after dQ: 1.01-1.05x, then 0.99-1.10x (causal D = 64 5.550 -> 5.067 ms) in one process, H200; 532
// SASS instructions a full-tile step where that one took 582.
// A consumer thread (warpgroup wg, t its index there) on item w, its K and V issued (ws_load_kv): the steps g0 to
// g_end - 1 (g_end = g0 + ws_steps), after_steps(), then dK and dV stored (store_dkdv_ws; with the shared-memory
// epilogue through s_stage: 4 boxes of 8 KB, 1024-byte aligned).
template <class Tr, class F>
  requires(Tr::BM == 128)
__device__ __forceinline__ void ws_consume(const BwdParams& p, const WsSmem<Tr>& sm, const detail::KeyTileWork& w,
                                           int g0, int g_end, int wg, int t, int lane, uint32_t s_stage,
                                           F&& after_steps) {
  using namespace detail;
  using Hf = typename Tr::Half;
  constexpr int BM = Tr::BM, S = Tr::kStages, kDQ = Tr::kDQ, NC = Tr::kConsumerThreads;
  const int b = w.b, hk = w.hk, k0 = w.k0;

  float dk[Tr::D / 2], dv[Tr::D / 2];
#pragma unroll
  for (int i = 0; i < Tr::D / 2; ++i) dk[i] = dv[i] = 0.f;
  const int rw = (t >> 5) * 16 + (lane >> 2);
  const int kr0 = wg * 64 + rw;
  const float sl2 = p.scale_log2;
  const int kvalid = mma::keys_valid(k0, p.k_len, p.perm_d, p.k_group);
  const uint32_t ds_off = stsm_ds_lane_off<Hf>(kr0);
  const StepOperands<Tr> ops(sm.k + wg * 64 * 128, sm.v + wg * 64 * 128, sm.q(0), sm.ds(0) + wg * Tr::kHalfDS, sm.k);

  cp_async_wait<0>();
  fence_proxy_async();
  named_sync(1, NC);

  // Half c's mask (StepMask) of entry e.
  auto entry_mask = [&](const int4& e) {
    unsigned long long mw[2] = {0, 0};
    if (e.y >= 0) {
      mw[0] = __ldg(p.masks + int64_t(e.y) * Tr::BN + kr0);
      mw[1] = __ldg(p.masks + int64_t(e.y) * Tr::BN + kr0 + 8);
    }
    return step_mask<64, true>(e, k0, kr0, e.x * 64, kvalid, mw);
  };
  uint32_t ds_lane = ds_off;
  for (int g = g0; g < g_end; ++g) {
    const int st = g % S;
    StepMask m[2];
    int4 an[2];
    mbar_wait(sm.full + 8 * st, (g / S) & 1);  // the stage's pair, written by the producer before its arrival
    an[0] = ld_shared_v4b32(sm.ent(st));
    an[1] = ld_shared_v4b32(sm.ent(st) + 16);

    // ---- S^T, dP^T: this warpgroup's 64 keys x the step's 128 queries ----
    float s[BM / 2], dp[BM / 2];
    const StepOperands<Tr> o(ops, st, g);
    issue_sdp_wait_s<Tr>(s, dp, o.kw, o.vw, o.q16, o.do16, [&] {  // the masks built under the two groups
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        m[c].kind = kFullEntry;  // (a full entry's words unread: apply_mask reads them for bitmask kinds)
        if (an[c].y != kFullEntry) m[c] = entry_mask(an[c]);
      }
    });
    // Half c: columns [64 c, 64 c + 64), the fragment's floats [32 c, 32 c + 32).
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      float(&sc)[32] = *reinterpret_cast<float(*)[32]>(&s[32 * c]);
      float(&dc)[32] = *reinterpret_cast<float(*)[32]>(&dp[32 * c]);
      apply_mask<64, true>(sc, m[c]);
      probs_dscores<64, true, false, true>(sc, dc, sm.rows(st) + c * 512, sl2);
    }
    wgmma_wait<0>();
    fence_regs(dp);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      float(&sc)[32] = *reinterpret_cast<float(*)[32]>(&s[32 * c]);
      float(&dc)[32] = *reinterpret_cast<float(*)[32]>(&dp[32 * c]);
      probs_dscores<64, false, true, true>(sc, dc, sm.rows(st) + c * 512, sl2);
    }

    uint32_t pa[BM / 16][4], da[BM / 16][4];
    // ---- dS^T, both halves, both warpgroups' keys (the lane's offset kept in a register, loop-carried through an
    // opaque asm; else ptxas re-derives it from SR_TID every step), then the consumers' barrier ----
    auto store_ds = [&] {
      asm("" : "+r"(ds_lane));
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const uint32_t(&dh)[4][4] = *reinterpret_cast<uint32_t(*)[4][4]>(&da[4 * c]);
        store_ds_stsm<Hf>(sm.ds(g) + c * Tr::kHalfDS, dh, ds_lane);
      }
      fence_proxy_async();
      named_sync(1, NC);
    };
    // ---- dQ of half wg (its 64 queries x 64 columns) = dS K over the 128 keys, to the writer's buffer ----
    float dq[kDQ / 2];
    auto stage_dq = [&] {
      if (g >= 1) mbar_wait(sm.dqempty + 8 * wg, (g - 1) & 1);
#pragma unroll
      for (int u = 0; u < kDQ / 8; ++u)
        st_shared_v4f32(sm.dq(wg) + (u * 128 + t) * 16, dq[4 * u], dq[4 * u + 1], dq[4 * u + 2], dq[4 * u + 3]);
      fence_proxy_async();
      mbar_arrive(sm.dqfull + 8 * wg);
    };

    // ---- dV, dS^T (barrier), dQ, dK; dQ staged while dK's group runs ----
    dv_ds_dq_dk<Tr>(s, dp, pa, da, dv, dk, dq, o, store_ds);
    stage_dq();
    wgmma_wait<0>();  // dK: every wgmma reading the stage is done
    fence_regs(dk);
    fence_regs(da);
    mbar_arrive(sm.empty + 8 * st);
  }

  after_steps();
  store_dkdv_ws<Tr>(p, dk, dv, b, hk, k0, kr0, s_stage);
}

// A CTA a key tile (where a later part adds to dK / dV, dk / dv admit no tensor map, or the lists are a run-time
// mask's; else tile_backward.cu launches the persistent grid below): producer thread, dQ writer thread and the 256
// consumer threads on the CTA's item, dK and dV stored from the K and V tiles (store_dkdv_ws).
template <class Tr>
__device__ __forceinline__ void tile_bwd_ws_body(const BwdParams& p) {
  using namespace detail;
  extern __shared__ uint8_t smem_raw[];
  const WsSmem<Tr> sm(smem_base_1024(smem_raw));
  // warp and wg through a lane-0 shuffle: warp-uniform to the compiler, so the wgmma descriptors stay in uniform
  // registers (tile_bwd_ws.cuh).
  const int tid = threadIdx.x, warp = __shfl_sync(0xffffffffu, tid >> 5, 0), lane = tid & 31;
  const detail::KeyTileWork w = warp_uniform(key_tile_work<Tr::BN>(p));
  if (w.n == 0 && p.dkv_accumulate) return;  // nothing to add (the whole CTA, before any barrier)
  if (tid == 0) {
    ws_init_barriers<Tr>(sm);
    fence_mbar_init();
  }
  __syncthreads();

  if (warp < 4) {
    setmaxnreg_dec<Tr::kProducerRegs>();
    if (warp == 0 && lane == 0) {
      ws_produce<Tr>(p, sm, w, 0);
    } else if (warp == 1 && lane == 0) {
      ws_write_dq<Tr>(p, sm, w, 0);
      bulk_wait_all<false>();  // the adds done before the CTA ends (the finish kernel reads them)
    }
    return;
  }
  setmaxnreg_inc<Tr::kConsumerRegs>();
  const int ct = tid - 128, wg = __shfl_sync(0xffffffffu, ct >> 7, 0), t = ct & 127;
  ws_load_kv<Tr>(p, sm, w, ct);
  ws_consume<Tr>(p, sm, w, 0, ws_steps<Tr>(p, w), wg, t, lane, sm.k, [] {});
}

// The persistent grid (Persistent<SmemEpilogue<BwdWs2Traits or BwdWsTraits<128>>>; tile_backward.cu,
// launch_persistent): CTAs an SM x SMs,
// each taking items (the one-CTA-an-item grid's CTAs, key_tile_work's order) as FA3's DynamicPersistentTileScheduler
// does: its first item blockIdx.x, each next one atomicAdd(p.work_counter, 1) + gridDim.x (with dQ owners every one
// from the counter: Ws2Items::take; the counter zeroed before the launch: a memset node under graph capture). The
// producer thread takes them (the next one after the item's loads) and hands each to the dQ writer and the 256 consumer
// threads through two item slots (item_full: the producer's arrival after its store; item_empty: the 257 readers', each
// as soon as it has read), so every role walks the same items and the producer runs up to two items ahead: it loads the
// next item's first Q / dO stages as soon as the ring has room, under the current item's last steps and dK / dV
// epilogue. Every role's step count runs on across items (ws_steps: the ring's stage and phase, the dS^T buffer, the dQ
// staging's dq_full / dq_empty phases). An item -1 ends the walk.
// K and V: dK / dV are staged in a dS^T buffer (free once both warpgroups' last dQ wgmma is done: every step waits
// for its wgmmas, and a consumer barrier follows the last step), so the consumers issue the next item's K and V right
// after that barrier, before the epilogue, their copies under its stmatrix and TMA stores; the next item's first dS^T
// store comes after its own consumer barrier (K / V landed), which the issuing threads reach only after their read
// waits. Against the one-CTA-an-item grid (H200, bf16, one process, backward time): local(256) 0.929, bigbird 0.932,
// longformer 0.931, local(256) | random 0.969, local(left=1024) GQA 0.995, causal 1.004. Staging dK / dV in the K and
// V tiles instead, the next K and V loaded after the epilogue's reads: 0.984-1.001 (bench/LOG.md, session 28).
// At D = 128 (64 queries a step) no dS^T buffer holds them (2 x 16 KB); the four dQ buffers do (64 KB), each warpgroup's
// boxes in its own two, once the writer has read the last two steps' dQ there (ws_consume of tile_bwd_ws.cuh); the next item's first dQ
// staging comes after its first dS^T barrier, past the issuing threads' read waits as above.
template <class Base>
struct Persistent : Base {
  static constexpr bool kPersist = true;
  static_assert(Base::BM == 128 ? Base::kDS == 4 * 8192 && Base::kOffDS % 1024 == 0
                                 : 4 * Base::kDQStage == 8 * 8192 && Base::kOffDQ % 1024 == 0,
                "the dK / dV boxes (2 D / 16 of 8 KB) in a dS^T buffer (D = 64) or the dQ buffers (D = 128)");
  // item_full[2], item_empty[2], the two slots' {item, first step}, the producer's {slots published, items, steps}
  static constexpr int kOffItems = Base::kOffEnt + WsSmem<Base>::kEnt * Base::kStages;
  static constexpr int kSmemBytes = kOffItems + 4 * 8 + 2 * 8 + 3 * 4 + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

template <class Tr>
struct Ws2Items {
  static constexpr int kReaders = 1 + Tr::kConsumerThreads;  // item_empty's arrivals: the writer, the consumers
  uint32_t full, empty, slot;
  __device__ __forceinline__ explicit Ws2Items(uint32_t base)
      : full(base + Tr::kOffItems), empty(full + 16), slot(empty + 16) {}
  // The producer thread's {slots published, items, steps issued}, in shared memory: in registers they are live
  // across its loads, and its 24 registers (setmaxnreg) spilled.
  __device__ __forceinline__ uint32_t producer_state() const { return slot + 16; }
  __device__ __forceinline__ void init(int count) const {
    for (int r = 0; r < 2; ++r) {
      detail::mbar_init(full + 8 * r, 1);
      detail::mbar_init(empty + 8 * r, kReaders);
    }
    detail::st_shared_s32(producer_state(), 0);
    detail::st_shared_s32(producer_state() + 4, count);
    detail::st_shared_s32(producer_state() + 8, 0);
  }
  // The producer's slot j (the CTA's j-th item): waits for its previous item's readers, then publishes the item
  // (-1: the walk's end) and the CTA's step count at its first step, so the readers carry neither across items.
  __device__ __forceinline__ void publish(int j, int item, int g0) const {
    const int r = j & 1;
    if (j >= 2) detail::mbar_wait(empty + 8 * r, ((j >> 1) - 1) & 1);
    detail::st_shared_s32(slot + 8 * r, item);
    detail::st_shared_s32(slot + 8 * r + 4, g0);
    detail::mbar_arrive(full + 8 * r);  // release: the slot's stores before it
  }
  // A reader's slot j: {item, first step} published there (the slot released at once).
  __device__ __forceinline__ int2 read(int j) const {
    const int r = j & 1;
    detail::mbar_wait(full + 8 * r, (j >> 1) & 1);
    const int2 v = make_int2(detail::ld_shared_s32(slot + 8 * r), detail::ld_shared_s32(slot + 8 * r + 4));
    detail::mbar_arrive(empty + 8 * r);
    return v;
  }
  // The next item from the counter (the producer thread): past the grid's first items (blockIdx.x), or, with dQ
  // owners, every item (first_item): a step waits on an owner's item only, and an item taken from the counter is a
  // running CTA's, where blockIdx.x's would be one that might not have started (a grid is not promised to be resident
  // at once: another kernel holding SMs, fewer SMs than the grid); CUB's onesweep takes its tiles so.
  static __device__ __forceinline__ int take(const BwdParams& p) {
    return atomicAdd(p.work_counter, 1) + (p.dq_owner ? 0 : int(gridDim.x));
  }
  // The CTA's first item (the producer warp, lane 0 taking it).
  static __device__ __forceinline__ int first_item(const BwdParams& p, int lane) {
    if (!p.dq_owner) return int(blockIdx.x);
    int t = 0;
    if (lane == 0) t = take(p);
    return __shfl_sync(0xffffffffu, t, 0);
  }
};

template <class Tr>
__device__ __forceinline__ void tile_bwd_ws_persist_body(const BwdParams& p) {
  using namespace detail;
  constexpr int NC = Tr::kConsumerThreads;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = smem_base_1024(smem_raw);
  const WsSmem<Tr> sm(base);
  const Ws2Items<Tr> items(base);
  const int tid = threadIdx.x, warp = __shfl_sync(0xffffffffu, tid >> 5, 0), lane = tid & 31;
  if (tid == 0) {
    ws_init_barriers<Tr>(sm);
    items.init(int(int64_t(p.k_tiles) * p.batch * p.kv_heads));
    fence_mbar_init();
  }
  __syncthreads();

  if (warp < 4) {
    setmaxnreg_dec<Tr::kProducerRegs>();
    if (warp == 0) {
      // The whole warp walks the items (an item's KeyTileWork warp-uniform: uniform registers, as the one-item
      // kernel's, which computes it before setmaxnreg; in lane 0's registers alone the producer spilled at 24),
      // lane 0 issues.
      const uint32_t ps = items.producer_state();
      for (int item = Ws2Items<Tr>::first_item(p, lane);;) {
        const int j = ld_shared_s32(ps), count = ld_shared_s32(ps + 4), g0 = ld_shared_s32(ps + 8);
        if (lane == 0) items.publish(j, item < count ? item : -1, g0);
        if (item >= count) break;
        const detail::KeyTileWork w = warp_uniform(key_tile_work<Tr::BN>(p, item));
        __syncwarp();  // every lane's state read before lane 0 writes it
        int next = 0;  // (not item: it would stay live across the loads in lane 0)
        if (lane == 0) {
          st_shared_s32(ps, j + 1);
          st_shared_s32(ps + 8, ws_produce<Tr>(p, sm, w, g0));
          next = Ws2Items<Tr>::take(p);
        }
        __syncwarp();
        item = __shfl_sync(0xffffffffu, next, 0);
      }
    } else if (warp == 1) {  // the dQ writer: the same, lane 0 reading the slots and issuing
      for (int j = 0;; ++j) {
        int2 it = make_int2(0, 0);
        if (lane == 0) it = items.read(j);
        it.x = __shfl_sync(0xffffffffu, it.x, 0), it.y = __shfl_sync(0xffffffffu, it.y, 0);
        if (it.x < 0) break;
        const detail::KeyTileWork w = warp_uniform(key_tile_work<Tr::BN>(p, it.x));
        if (lane == 0) ws_write_dq<Tr>(p, sm, w, it.y);
        __syncwarp();
      }
      if (lane == 0) bulk_wait_all<false>();  // the adds done before the CTA ends (the finish kernel reads them)
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<Tr::kConsumerRegs>();
  int2 it = items.read(0);
  detail::KeyTileWork w{};
  if (it.x >= 0) {
    w = warp_uniform(key_tile_work<Tr::BN>(p, it.x));
    ws_load_kv<Tr>(p, sm, w, ws2_consumer_index());
  }
  for (int j = 1; it.x >= 0; ++j) {
    const int ct = ws2_consumer_index(), wg = __shfl_sync(0xffffffffu, ct >> 7, 0), t = ct & 127, ln = ct & 31;
    int2 nx = make_int2(-1, 0);
    detail::KeyTileWork nw{};
    auto next = [&] {
      named_sync(1, NC);  // both warpgroups' last wgmmas (K, V, the last dS^T) done
      nx = items.read(j);
      if (nx.x >= 0) {
        nw = warp_uniform(key_tile_work<Tr::BN>(p, nx.x));
        ws_load_kv<Tr>(p, sm, nw, ws2_consumer_index());
      }
    };
    const int g_end = it.y + ws_steps<Tr>(p, w);
    // dK / dV staged in the dS^T buffer the last step left free (D = 64) or in the dQ buffers (D = 128)
    ws_consume<Tr>(p, sm, w, it.y, g_end, wg, t, ln, Tr::BM == 128 ? sm.ds(g_end + 1) : sm.dq(0), next);
    it = nx, w = nw;
  }
}

// The warp-specialized kernels: 64 queries a step (BwdWsTraits, tile_bwd_ws.cuh) or 128 (BwdWs2Traits; on the
// persistent grid where Tr is Persistent's).
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1) tile_bwd_ws_kernel(const __grid_constant__ BwdParams p) {
#ifdef __CUDA_ARCH__
  if constexpr (!mma::kWgmmaAvailable) {
    __trap();
  } else if constexpr (kPersistOf<Tr>) {
    tile_bwd_ws_persist_body<Tr>(p);
  } else {
    tile_bwd_ws_body<Tr>(p);
  }
#endif
}

}  // namespace spattn::cuda::bwd
