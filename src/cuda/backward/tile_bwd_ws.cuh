// cuda/backward/tile_bwd_ws.cuh — the warp-specialized backward over a key-major tile plan (sm_90a), FA3's
// backward shape (hopper/flash_bwd_kernel_sm90.h, mainloop_bwd_sm90_tma_gmma_ws.hpp) on tile_bwd.cuh's step:
//
//   a CTA per (key tile of 128 keys, batch, kv head) or CTAs an SM taking them in turn, 384 threads
//   warpgroup 0   warp 0: the producer; one thread loads each step's Q, dO (tensor maps), lse2 and delta (bulk
//                 copies) and its plan entry (16 bytes, stored before the stage's arrival) into a ring of kStages
//                 stages (`full` mbarriers complete on the bytes, `empty` ones on the consumers' release), running
//                 ahead of the consumers.
//                 warp 1: the dQ writer; one thread adds each step's dQ, staged in shared memory by the consumers,
//                 into the fp32 accumulator by bulk reduce-add (cp.reduce.async.bulk .add.f32, done at L2), a
//                 warpgroup's half at a time, and frees the staging buffer once its reads are done.
//                 setmaxnreg gives the warpgroup's registers to the consumers (24 / 240).
//   warpgroups 1, 2   consumers, 64 keys each (as tile_bwd.cuh's two warpgroups): S^T and dP^T issued as two
//                 wgmma groups (P^T's exponentials run under dP^T's wgmma), dV by RS wgmma, dS^T through a
//                 double-buffered shared tile (one 256-thread barrier a step: both halves of the key tile stored),
//                 then dQ = dS K (this warpgroup's D/2 columns) and dK by RS wgmma as two more groups: dQ is staged
//                 for the writer in its register order (tile_bwd.cuh, the ws accumulator order above ws_fin_swz;
//                 bwd_finish_tile_kernel<..., D / 2, ...> reads it) while dK's group runs (dv_ds_dq_dk).
//
// No CTA-wide barrier inside the loop and no red.global in the consumers. Identity plans whose q and dout admit
// tensor maps only (TileBackward runs the 64x128 tile_bwd_kernel row of the head dim otherwise).
//
// Its roles (ws_produce, ws_write_dq, ws_consume for BM = 64) run head dim 128 (sm90_bwd_ws_64x128_d128) on either grid of
// tile_bwd_ws2.cuh (a CTA a key tile, or the persistent one). Head dim 64 runs tile_bwd_ws2.cuh's 128 queries a
// step, which replaced this step there and takes BwdWsTraits<64, *> as the traits of its 64-query halves (store_ds).
#pragma once
#include "cuda/backward/tile_bwd.cuh"

namespace spattn::cuda::bwd {

template <int D_, bool kBf16_>
struct BwdWsTraits {
  static constexpr int BM = 64, BN = 128, D = D_, kThreads = 384, kConsumerThreads = 256;
  static constexpr bool kBf16 = kBf16_;
  static_assert(D == 64 || D == 128, "head dim 64 or 128");
  static constexpr int kStages = D == 64 ? 3 : 2;
  static constexpr int kDQ = D / 2;  // dQ columns of a consumer warpgroup
  static constexpr int kKV = BN * D * 2, kQ = BM * D * 2, kDS = BN * BM * 2;
  static constexpr int kDQStage = BM * kDQ * 4;  // a warpgroup's staged dQ (fp32)
  static constexpr int kOffV = kKV, kOffStage = 2 * kKV;  // stage s: Q at kOffStage + 2 s kQ, dO after it
  static constexpr int kOffDS = kOffStage + kStages * 2 * kQ;   // two dS^T buffers (step parity)
  static constexpr int kOffDQ = kOffDS + 2 * kDS;               // [step parity][consumer warpgroup] staged dQ
  static constexpr int kOffRows = kOffDQ + 4 * kDQStage;        // stage s: lse2 at + 2 s BM 4, delta after it
  static constexpr int kOffBar = kOffRows + kStages * 2 * BM * 4;  // full[S], empty[S], dq_full[4], dq_empty[4]
  static constexpr int kStepBytes = 2 * kQ + 2 * BM * 4;
  static constexpr int kOffEnt = kOffBar + (2 * kStages + 8) * 8;  // stage s's entry (16 bytes) at + 16 s
  static constexpr int kSmemBytes = kOffEnt + 16 * kStages + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 65536, "register split");
  using Elem = typename std::conditional<kBf16, __nv_bfloat16, __half>::type;
};

// The CTA's work through lane-0 shuffles (every thread of the warp present): values the compiler then knows are
// warp-uniform, kept in uniform registers (the D = 64 kernel had spilled its per-thread n and np: 3 LDL a step, 1
// with this).
__device__ __forceinline__ detail::KeyTileWork warp_uniform(detail::KeyTileWork w) {
  auto u = [](int x) { return __shfl_sync(0xffffffffu, x, 0); };
  w.b = u(w.b), w.hk = u(w.hk), w.k0 = u(w.k0), w.ne = u(w.ne), w.n = u(w.n);
  w.e0 = (int64_t(u(int(w.e0 >> 32))) << 32) | uint32_t(u(int(uint32_t(w.e0))));
  return w;
}
// The aligned base of the dynamic shared memory as a shared-window address, computed there (no generic address: no
// SR_SWINHI and 64-bit adds at the top of each step where the compiler rematerializes it).
__device__ __forceinline__ uint32_t smem_base_1024(uint8_t* smem_raw) {
  return (detail::smem_u32(smem_raw) + 1023u) & ~1023u;
}

// S^T = K Q^T and dP^T = V dO^T (this warpgroup's keys kw, vw) as two wgmma groups, S^T waited for: P^T's
// exponentials run while dP^T's group does (the caller waits for it). Operands (detail::operand) at leading-byte
// offset 16, the step's q and d_o too.
// issued(): run after both groups are issued, before the wait (the masks' reads and their building).
template <class Tr, class O, class F>
__device__ __forceinline__ void issue_sdp_wait_s(float (&s)[Tr::BM / 2], float (&dp)[Tr::BM / 2], const O& kw,
                                                 const O& vw, const O& q, const O& d_o, F&& issued) {
  using namespace detail;
  fence_regs(s);
  fence_regs(dp);
  wgmma_fence();
  mma_keys_queries<Tr>(s, kw, q);
  wgmma_commit();
  mma_keys_queries<Tr>(dp, vw, d_o);
  wgmma_commit();
  issued();
  wgmma_wait<1>();
  fence_regs(s);
}

// A step's wgmma operands: kw, vw (this warpgroup's K and V rows), q16, do16 (the stage's Q and dO, K-major: leading
// byte offset 16), qbm, dobm (MN-major: BM 128), ds (the step's dS^T buffer), kcols (K's dQ columns; BN 128).
// The first constructor builds the descriptors of stage 0 / buffer 0 once, before the loop (Desc64, opaque: the
// compiler neither rematerializes nor re-derives them); a step's (the second) adds the stage's and buffer's offsets in
// 16-byte units.
template <class Tr>
struct StepOperands {
  using O = detail::Desc64;
  O kw, vw, q16, do16, qbm, dobm, ds, kcols;
  __device__ __forceinline__ StepOperands(uint32_t s_kw, uint32_t s_vw, uint32_t s_q, uint32_t s_ds, uint32_t s_kcols) {
    using detail::operand;
    kw = operand<true>(s_kw, 16), vw = operand<true>(s_vw, 16);
    q16 = operand<true>(s_q, 16), do16 = operand<true>(s_q + Tr::kQ, 16);
    qbm = operand<true>(s_q, Tr::BM * 128), dobm = operand<true>(s_q + Tr::kQ, Tr::BM * 128);
    ds = operand<true>(s_ds, Tr::BN * 128), kcols = operand<true>(s_kcols, Tr::BN * 128);
  }
  // Step i at stage st, from `first`.
  __device__ __forceinline__ StepOperands(const StepOperands& first, int st, int i) {
    const uint32_t qo = uint32_t(st) * (2 * Tr::kQ / 16), dso = uint32_t(i & 1) * (Tr::kDS / 16);
    kw = first.kw, vw = first.vw, kcols = first.kcols;
    q16 = first.q16 + qo, do16 = first.do16 + qo, qbm = first.qbm + qo, dobm = first.dobm + qo;
    ds = first.ds + dso;
  }
};

// The step's P^T and dS^T, each in two parts (FA4's order): this thread's lse2 (delta) pairs, columns 8 j + cb with
// cb = 2 (t & 3), read by 8 ld.shared.v2 at immediate offsets (as probs_dscores' kImm) before S^T's wgmma is issued
// (after S^T's wait), their latency under it (under P^T); then the values in place as probs_dscores' (the same
// arithmetic): P^T = exp2(S^T scale log2 e - lse2), dS^T = P^T (dP^T - delta).
template <int BM>
__device__ __forceinline__ void load_row_pairs(float2 (&v)[BM / 8], uint32_t row_s) {
  uint32_t base = row_s + 8 * (threadIdx.x & 3);
  asm("" : "+r"(base));
#pragma unroll
  for (int j = 0; j < BM / 8; ++j) v[j] = detail::ld_shared_f2(base + 32 * j);
}
template <int BM, bool kP>
__device__ __forceinline__ void probs_or_dscores(float (&s)[BM / 2], float (&dp)[BM / 2], const float2 (&v)[BM / 8],
                                                 float sl2) {
#pragma unroll
  for (int j = 0; j < BM / 8; ++j)
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int idx = 4 * j + x;
      const float r = x & 1 ? v[j].y : v[j].x;
      if constexpr (kP)
        s[idx] = detail::ex2_ftz(fmaf(s[idx], sl2, -r));
      else
        dp[idx] = s[idx] * (dp[idx] - r);
    }
}

// The kernels' shared memory (Tr's offsets from the aligned base, smem_base_1024): the K and V tiles, the ring's
// stages (Q, dO, lse2 and delta rows, entries), the dS^T buffers, the staged dQ and the mbarriers full[S], empty[S],
// dq_full[kDQBufs], dq_empty[kDQBufs]. 64 queries a step (BwdWsTraits): 4 dQ buffers (x = 2 (step & 1) + warpgroup),
// an entry a stage; 128 (BwdWs2Traits, tile_bwd_ws2.cuh): 2 (x = warpgroup), two entries a stage.
template <class Tr>
struct WsSmem {
  static constexpr int BM = Tr::BM, S = Tr::kStages, kDQBufs = BM == 128 ? 2 : 4, kEnt = BM == 128 ? 32 : 16;
  uint32_t k, v, full, empty, dqfull, dqempty;
  __device__ __forceinline__ explicit WsSmem(uint32_t base)
      : k(base), v(base + Tr::kOffV), full(base + Tr::kOffBar), empty(full + 8 * S), dqfull(empty + 8 * S),
        dqempty(dqfull + 8 * kDQBufs) {}
  __device__ __forceinline__ uint32_t q(int st) const { return k + Tr::kOffStage + uint32_t(st) * 2 * Tr::kQ; }
  __device__ __forceinline__ uint32_t d_o(int st) const { return q(st) + Tr::kQ; }
  // lse2 then delta (64 queries a step: BM each; 128: half c at + 512 c, 64 each)
  __device__ __forceinline__ uint32_t rows(int st) const { return k + Tr::kOffRows + uint32_t(st) * 2 * BM * 4; }
  __device__ __forceinline__ uint32_t ds(int g) const { return k + Tr::kOffDS + uint32_t(g & 1) * Tr::kDS; }
  __device__ __forceinline__ uint32_t dq(int x) const { return k + Tr::kOffDQ + uint32_t(x) * Tr::kDQStage; }
  __device__ __forceinline__ uint32_t ent(int st) const { return k + Tr::kOffEnt + uint32_t(st) * kEnt; }
};

// The ring's and dQ staging's mbarriers (thread 0; a fence and a CTA barrier after).
template <class Tr>
__device__ __forceinline__ void ws_init_barriers(const WsSmem<Tr>& sm) {
  using namespace detail;
  for (int s = 0; s < Tr::kStages; ++s) {
    mbar_init(sm.full + 8 * s, 1);                      // the producer's expect_tx; completes on the bytes
    mbar_init(sm.empty + 8 * s, Tr::kConsumerThreads);  // every consumer thread done with the stage
  }
  for (int x = 0; x < WsSmem<Tr>::kDQBufs; ++x) {
    mbar_init(sm.dqfull + 8 * x, 128);  // the warpgroup's threads stored their dQ
    mbar_init(sm.dqempty + 8 * x, 1);   // the writer's bulk reads of it done
  }
}

// Item w's K and V rows into their tiles by the consumer threads (ct in [0, 256)): cp.async, committed.
template <class Tr>
__device__ __forceinline__ void ws_load_kv(const BwdParams& p, const WsSmem<Tr>& sm, const detail::KeyTileWork& w,
                                           int ct) {
  using namespace detail;
  constexpr int NC = Tr::kConsumerThreads;
  const char* kg = static_cast<const char*>(p.k) + 2 * (int64_t(w.b) * p.k_sb + int64_t(w.hk) * p.k_sh);
  const char* vg = static_cast<const char*>(p.v) + 2 * (int64_t(w.b) * p.v_sb + int64_t(w.hk) * p.v_sh);
  load_rows<Tr::BN, Tr::D, NC>(sm.k, kg, p.k_sl * 2, w.k0, p.k_len, p.perm_d, p.k_group, ct);
  load_rows<Tr::BN, Tr::D, NC>(sm.v, vg, p.v_sl * 2, w.k0, p.k_len, p.perm_d, p.k_group, ct);
  cp_async_commit();
}

// The roles over item w at 64 queries a step (requires BM = 64; tile_bwd_ws2.cuh's overloads of the same names take
// 128): the key tile's n = ne x group steps, query head hk * group + i / ne, entry i % ne at step i, the CTA's step
// count g = g0 + i running on across a persistent CTA's items (the ring's stage and phase, the dS^T buffer, the staged
// dQ's buffer and phases); the producer and the writer return the count after the item.
// The producer thread: the step's Q and dO (tensor maps), lse2 and delta (bulk copies) and its entry (16 bytes,
// stored before the stage's arrival).
template <class Tr>
  requires(Tr::BM == 64)
__device__ __forceinline__ int ws_produce(const BwdParams& p, const WsSmem<Tr>& sm, const detail::KeyTileWork& w,
                                          int g0) {
  using namespace detail;
  constexpr int S = Tr::kStages;
  int g = g0;
  for (int i = 0; i < w.n; ++i, ++g) {
    const int st = g % S;
    if (g >= S) mbar_wait(sm.empty + 8 * st, ((g / S) - 1) & 1);
    const int4 ei = __ldg(&p.entries[step_entry(p, w, i)]);
    st_shared_v4b32(sm.ent(st), ei);
    tma_step<Tr>(p, sm.q(st), sm.d_o(st), sm.rows(st), sm.full + 8 * st, w.b, w.hk * p.group + i / w.ne,
                 ei.x * Tr::BM);
  }
  return g;
}

// The dQ writer thread: each step's dQ (both consumer warpgroups' D / 2 columns, staged in x = 2 (g & 1) + wg) added
// into the fp32 accumulator by bulk reduce-add, the buffers freed once their reads are done. With p.dq_owner the
// tile's owner stores instead (no add: prep has not zeroed the accumulator) and, once the copy is complete (its
// completion fences the async proxy's writes for the generic proxy), publishes the tile's flag; any other step waits
// for that flag before its adds. The waits go only to items taken earlier (BwdParams::dq_owner), and the writer that
// waits holds nothing the owner's CTA needs.
template <class Tr>
  requires(Tr::BM == 64)
__device__ __forceinline__ int ws_write_dq(const BwdParams& p, const WsSmem<Tr>& sm, const detail::KeyTileWork& w,
                                           int g0) {
  using namespace detail;
  int g = g0;
  for (int i = 0; i < w.n; ++i, ++g) {
    const int h = w.hk * p.group + i / w.ne;
    const int qt = __ldg(&p.entries[step_entry(p, w, i)]).x;
    const int64_t unit = int64_t(w.b) * p.q_heads + h;
    float* acc = p.dq_acc + (unit * p.qp + int64_t(qt) * Tr::BM) * Tr::D;
    bool own = false;
    int* ready = nullptr;
    if (p.dq_owner) {
      ready = p.dq_ready + unit * (p.qp / Tr::BM) + qt;
      own = __ldg(p.dq_owner + qt) * Tr::BN == w.k0;
      if (!own) {
        while (ld_acquire_gpu(ready) == 0) __nanosleep(64);
        fence_proxy_async_global();  // the adds after the flag
      }
    }
    const int x0 = 2 * (g & 1);
#pragma unroll
    for (int c = 0; c < 2; ++c) {  // consumer warpgroup c's columns
      mbar_wait(sm.dqfull + 8 * (x0 + c), (g >> 1) & 1);
      if (own)
        bulk_store(acc + c * Tr::BM * Tr::kDQ, sm.dq(x0 + c), Tr::kDQStage);
      else
        bulk_reduce_add_f32(acc + c * Tr::BM * Tr::kDQ, sm.dq(x0 + c), Tr::kDQStage);
    }
    bulk_commit();
    if (own) {
      bulk_wait_all<false>();  // the stores complete
      fence_proxy_async_global();
      st_release_gpu(ready, 1);
    } else {
      bulk_wait_all<true>();
    }
    mbar_arrive(sm.dqempty + 8 * x0);
    mbar_arrive(sm.dqempty + 8 * (x0 + 1));
  }
  return g;
}

// The persistent grid's traits (tile_bwd_ws2.cuh); kPersistOf<Tr>: Tr is one.
template <class Tr>
inline constexpr bool kPersistOf = requires { requires Tr::kPersist; };

// A consumer thread (warpgroup wg, t its index there) on item w, its K and V issued (ws_load_kv): the steps g0 to
// g_end - 1, after_steps(), then dK and dV stored (store_dkdv_ws; with the shared-memory epilogue through s_stage).
// A step: its entry from the producer through shared memory, wgmma descriptors built once and stepped by 64-bit adds
// (StepOperands), lse2 and delta read ahead at immediate offsets (load_row_pairs), dS^T stored by stmatrix
// (store_ds_stsm), the last three products in FA3's order (dv_ds_dq_dk), the shared base aligned in the shared window
// (smem_base_1024). On the persistent grid dK and dV go out through this warpgroup's two dQ buffers (s_stage: the
// first; store_dkdv_smem's boxes of warpgroup wg are buffers wg and 2 + wg), once the writer has read the last two
// steps' dQ there.
template <class Tr, class F>
  requires(Tr::BM == 64)
__device__ __forceinline__ void ws_consume(const BwdParams& p, const WsSmem<Tr>& sm, const detail::KeyTileWork& w,
                                           int g0, int g_end, int wg, int t, int lane, uint32_t s_stage,
                                           F&& after_steps) {
  using namespace detail;
  constexpr int BM = Tr::BM, BN = Tr::BN, D = Tr::D, S = Tr::kStages, kDQ = Tr::kDQ, NC = Tr::kConsumerThreads;
  const int k0 = w.k0;
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  const int rw = (t >> 5) * 16 + (lane >> 2);  // this thread's first key row in its warpgroup's 64
  const int kr0 = wg * 64 + rw;                // ... in the CTA's 128 (second: + 8)
  const float sl2 = p.scale_log2;
  const int kvalid = mma::keys_valid(k0, p.k_len, p.perm_d, p.k_group);
  // K MN-major for dQ: D = 128, the warpgroup's 64-column block; D = 64, 32 columns in.
  const uint32_t s_kcols = sm.k + (D == 128 ? wg * BN * 128 : wg * 64);
  const uint32_t ds_off = stsm_ds_lane_off<Tr>(kr0);
  const StepOperands<Tr> ops(sm.k + wg * 64 * 128, sm.v + wg * 64 * 128, sm.q(0), sm.ds(0), s_kcols);

  cp_async_wait<0>();
  fence_proxy_async();
  named_sync(1, NC);  // K and V visible to both consumer warpgroups

  // ---- dQ to the writer: staged in this thread's register order (buffer x = 2 (g & 1) + wg) ----
  auto stage_dq = [&](const float (&dq)[kDQ / 2], int g) {
    const int x = 2 * (g & 1) + wg;
    if (g >= 2) mbar_wait(sm.dqempty + 8 * x, ((g >> 1) - 1) & 1);
#pragma unroll
    for (int u = 0; u < kDQ / 8; ++u)
      st_shared_v4f32(sm.dq(x) + (u * 128 + t) * 16, dq[4 * u], dq[4 * u + 1], dq[4 * u + 2], dq[4 * u + 3]);
    fence_proxy_async();
    mbar_arrive(sm.dqfull + 8 * x);
  };

  for (int g = g0; g < g_end; ++g) {
    const int st = g % S;
    // the stage's entry, written by the producer before its arrival: no global read (and no rotation) a step
    mbar_wait(sm.full + 8 * st, (g / S) & 1);
    const int4 e = ld_shared_v4b32(sm.ent(st));
    const int q0 = e.x * BM;
    unsigned long long mw[2] = {0, 0};
    auto mask_words = [&] {
      if (e.y >= 0) {
        mw[0] = __ldg(p.masks + int64_t(e.y) * BN + kr0);
        mw[1] = __ldg(p.masks + int64_t(e.y) * BN + kr0 + 8);
      }
    };

    // ---- S^T = K Q^T and dP^T = V dO^T as two groups: P^T while dP^T runs ----
    float s[BM / 2], dp[BM / 2];
    const StepOperands<Tr> o(ops, st, g);
    float2 l2[BM / 8], dl[BM / 8];
    load_row_pairs<BM>(l2, sm.rows(st));
    issue_sdp_wait_s<Tr>(s, dp, o.kw, o.vw, o.q16, o.do16, mask_words);  // the entry's LDS not waited for first
    load_row_pairs<BM>(dl, sm.rows(st) + BM * 4);
    mask_step<Tr, true>(s, e, k0, kr0, q0, kvalid, mw);
    probs_or_dscores<BM, true>(s, dp, l2, sl2);
    wgmma_wait<0>();
    fence_regs(dp);
    probs_or_dscores<BM, false>(s, dp, dl, sl2);

    // ---- dV, dS^T (barrier), dQ, dK; dQ staged for the writer while dK's group runs ----
    uint32_t pa[BM / 16][4], da[BM / 16][4];
    float dq[kDQ / 2];
    dv_ds_dq_dk<Tr>(s, dp, pa, da, dv, dk, dq, o, [&] {  // dS^T (this warpgroup's keys) by stmatrix
      store_ds_stsm<Tr>(sm.ds(g), da, ds_off);
      fence_proxy_async();
      named_sync(1, NC);
    });
    stage_dq(dq, g);
    wgmma_wait<0>();  // dK: every wgmma reading the stage is done
    fence_regs(dk);
    fence_regs(da);
    mbar_arrive(sm.empty + 8 * st);
  }

  after_steps();
  if constexpr (kPersistOf<Tr>) {
    static_assert(D == 128 && Tr::kDQStage == 2 * 8192, "dK / dV boxes: two 8 KB boxes a dQ buffer");
    for (int g = g_end - 2; g < g_end; ++g)
      if (g >= 0) mbar_wait(sm.dqempty + 8 * (2 * (g & 1) + wg), (g >> 1) & 1);
  }
  store_dkdv_ws<Tr>(p, dk, dv, w.b, w.hk, k0, kr0, s_stage);
}

}  // namespace spattn::cuda::bwd
