// cuda/common/ptx.cuh — the device-side PTX wrappers of every spattn kernel (fused/ and unfused/): one name
// per operation. Kernel-specific code (tile loops, softmax, masks, the wgmma ops that fused/gen_wgmma.py
// generates) stays with its kernels.
//
// Memory clobbers: every wrapper that orders memory for the kernel (cp.async and its commit / wait, mbarriers,
// named barriers, fences, bulk copies, the shared-memory words that hand work items over) has a "memory" clobber,
// so the compiler moves no load or store across it. ldmatrix and st_shared_b16 have none (nor had they before
// this header): the tiles they read and write are ordered by the barriers and waits around them, and a clobber
// would also order every global load of the loops they sit in.
//
// SPATTN_WGMMA is defined in device code compiled for sm_90a (wgmma, TMA, mbarrier try_wait, setmaxnreg, fences
// of the async proxy); SPATTN_SM90A_ONLY(statement) keeps its statement there only. The wrappers of those
// operations compile to nothing elsewhere, so that a kernel template instantiated for every architecture compiles
// everywhere (and traps where it would need them: fused/).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SPATTN_WGMMA 1
#define SPATTN_SM90A_ONLY(...) __VA_ARGS__
#else
#define SPATTN_SM90A_ONLY(...)
#endif

namespace spattn::cuda::ptx {

// ---- addresses, special registers ---------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ unsigned long long globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned smid() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

// ---- math -------------------------------------------------------------------------------------------------
// max(a, b) that returns NaN where either is NaN (fmaxf returns the other): one FMNMX.NAN (sm_80+).
__device__ __forceinline__ float max_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float y;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(y) : "f"(a), "f"(b));
  return y;
#else
  return a != a || b != b ? __int_as_float(0x7fffffff) : fmaxf(a, b);
#endif
}
// 2^x in one MUFU.EX2 (exp2f adds a range fix-up around it); subnormal results flush to 0, 2^-inf = 0.
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Kernels that keep scores unscaled form p = 2^(s sl2 - ms) with one FMA against ms = m sl2 rounded to fp32: every
// p of the row carries the factor 2^r of that rounding, r up to half an ulp of ms. It cancels in O and moves the LSE
// by r ln 2, until 2^r passes what P (fp16: 2^16) or the sums hold: from |m sl2| >= 2^28 (2^4 = 2^(28 - 24)) a row
// may come out as 0, infinite or empty (a score 2^28 above the next key's: a scale or inputs past any use). Such
// rows are made NaN, O and LSE: never finite and wrong (PATTERNS.md).
__device__ __forceinline__ bool scaled_max_lost(float m, float sl2) {
  return m != -INFINITY && fabsf(m * sl2) >= 268435456.f;
}

// a * b as 64 bits, one 32 x 32 -> 64-bit multiply (a row gather's offset, token x stride: the compiler keeps an
// int64 product of two widened ints as a 64 x 64-bit multiply, three IMADs).
__device__ __forceinline__ uint64_t mul_wide_u32(uint32_t a, uint32_t b) {
  uint64_t r;
  asm("mul.wide.u32 %0, %1, %2;" : "=l"(r) : "r"(a), "r"(b));
  return r;
}

// ---- cp.async (sm_80+) --------------------------------------------------------------------------------------
// 16 bytes from global to shared memory; of them src_bytes (0 or 16) are read, the rest zero-filled (src_bytes 0:
// a row past the end, whose source is never read). The destination as a shared-memory address (smem_u32: hoisted
// out of a loop) or as a pointer into shared memory.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  cp_async16(smem_u32(dst), src, src_bytes);
}
// A bool would convert to 1 byte: say ok ? 16 : 0.
__device__ void cp_async16(uint32_t dst, const void* src, bool valid) = delete;
__device__ void cp_async16(void* dst, const void* src, bool valid) = delete;
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- shared-memory accesses -----------------------------------------------------------------------------------
// 32-bit words handed between warps (the fused TMA kernels' work-item slots): a volatile generic pointer would
// compile to strong system-scope generic accesses; these are plain shared ones, ordered by the caller's mbarrier.
__device__ __forceinline__ void st_shared_s32(uint32_t addr, int v) {
  asm volatile("st.shared.s32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared_v4f32(uint32_t addr, float a, float b, float c, float d) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
__device__ __forceinline__ int ld_shared_s32(uint32_t addr) {
  int v;
  asm volatile("ld.shared.s32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
// One 16-bit store at a 32-bit shared address (no clobber: see the file comment).
__device__ __forceinline__ void st_shared_b16(uint32_t addr, unsigned short v) {
  asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(addr), "h"(v));
}

// ---- ldmatrix / stmatrix -------------------------------------------------------------------------------------
// Four 8x8 16-bit matrices from shared memory into the mma.sync fragment layout (lane l gives the address of row
// l & 7 of matrix l >> 3); _trans transposes each. The address as for cp_async16.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) { ldmatrix_x4(r, smem_u32(p)); }
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  ldmatrix_x4_trans(r, smem_u32(p));
}
// Four 8x8 16-bit matrices from the mma accumulator layout to shared memory (lane l: row l & 7 of matrix l >> 3).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  SPATTN_SM90A_ONLY(asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                                 "r"(a), "r"(b), "r"(c), "r"(d)
                                 : "memory"));
}

// ---- mma.sync (sm_80+) -------------------------------------------------------------------------------------------
// D += A(16x16, row) * B(16x8, col), bf16 (kBf16) or fp16 inputs, fp32 accumulators d[0..3]: a float[4], or a
// pointer to 4 floats of a longer array. d is taken as given: a float* parameter for both changed the unfused
// coarse SDDMM's code (block 64: 1640 -> 1648 instructions on sm_90a), the float[4] one it had before does not.
template <bool kBf16, class Acc>
__device__ __forceinline__ void mma16816(Acc&& d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// ---- wgmma synchronization (sm_90a; the ops themselves: fused/wgmma_ops.cuh) ------------------------------------
// Register fences: the compiler keeps no access to these accumulators / operands across them (around the
// asynchronous wgmma that reads and writes them).
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int A, int B>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[A][B]) {
#pragma unroll
  for (int i = 0; i < A; ++i)
#pragma unroll
    for (int j = 0; j < B; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}
__device__ __forceinline__ void wgmma_fence() {
  SPATTN_SM90A_ONLY(asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"));
}
__device__ __forceinline__ void wgmma_commit() {
  SPATTN_SM90A_ONLY(asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"));
}
// Until at most N of this warpgroup's committed wgmma groups are still running.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  SPATTN_SM90A_ONLY(asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"));
}

// ---- fences -------------------------------------------------------------------------------------------------------
// cp.async and st.shared writes are generic-proxy writes; wgmma and bulk copies read through the async proxy.
__device__ __forceinline__ void fence_proxy_async() {
  SPATTN_SM90A_ONLY(asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"));
}
// Makes mbarrier initializations visible to the async proxy (bulk copies completing on them).
__device__ __forceinline__ void fence_mbar_init() {
  SPATTN_SM90A_ONLY(asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"));
}

// ---- mbarriers (shared::cta, 64-bit) -----------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// `count` arrivals on `bar` from one thread.
__device__ __forceinline__ void mbar_arrive_n(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// One arrival that also expects `bytes` more of transactions (bulk copies completing on `bar`).
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// This thread's earlier cp.asyncs count as one arrival on `bar` once they have landed.
__device__ __forceinline__ void mbar_arrive_copies(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Until the phase of parity `parity` of `bar` has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
#ifdef SPATTN_WGMMA
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
#endif
}

// ---- named barriers ------------------------------------------------------------------------------------------------
// Barrier `id` (0 is __syncthreads') over `count` threads (a multiple of 32): sync waits, arrive does not.
__device__ __forceinline__ void named_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// ---- bulk tensor copies (TMA, sm_90a) ---------------------------------------------------------------------------
// A box of the 4-D tensor map `tmap` (coordinates c0 innermost) into shared memory at `dst`, completing on `bar`.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void* tmap, uint32_t bar, int c0, int c1, int c2,
                                            int c3) {
  SPATTN_SM90A_ONLY(asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(tmap), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory"));
}
// `bytes` (a multiple of 16, 16-byte aligned ends) of global memory into shared memory at `dst`, completing on `bar`.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  SPATTN_SM90A_ONLY(asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst), "l"(src),
      "r"(bytes), "r"(bar)
      : "memory"));
}
// Starts bringing `bytes` (a multiple of 16, 16-byte aligned) of global memory into L2 (sm_90+; nothing below).
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
#endif
}
// A box of shared memory at `src` to the 4-D tensor map (elements past the tensor's end are dropped), in this
// thread's bulk async-group; bulk_commit() closes the group, bulk_wait_all() waits for every group (kRead: only
// until the sources have been read and may be rewritten).
__device__ __forceinline__ void tma_store_4d(const void* tmap, uint32_t src, int c0, int c1, int c2, int c3) {
  SPATTN_SM90A_ONLY(asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(tmap), "r"(c0),
      "r"(c1), "r"(c2), "r"(c3), "r"(src)
      : "memory"));
}
// fp32 add of `bytes` (a multiple of 16, 16-byte aligned ends) of shared memory at `src` into global memory at
// `dst` (done by the copy engine at L2), in this thread's bulk async-group (bulk_commit, bulk_wait_all).
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
  SPATTN_SM90A_ONLY(asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes)
      : "memory"));
}
__device__ __forceinline__ void bulk_commit() {
  SPATTN_SM90A_ONLY(asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"));
}
template <bool kRead>
__device__ __forceinline__ void bulk_wait_all() {
#ifdef SPATTN_WGMMA
  if constexpr (kRead)
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
  else
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}

// ---- register reallocation (sm_90a, warpgroup-wide) -----------------------------------------------------------------
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  SPATTN_SM90A_ONLY(asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  SPATTN_SM90A_ONLY(asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)));
}

// ---- programmatic dependent launch (sm_90+) ------------------------------------------------------------------------
// A kernel launched as a programmatic dependent (cuda/common/launch.cuh, launch_pdl) may start while the kernel
// before it in the stream is still running; it must call pdl_wait() before it reads anything that kernel writes
// (and before any global write: then everything before it in the stream has completed). pdl_launch_dependents()
// lets the next such kernel start once every CTA of this grid has called it or exited. Both are no-ops without
// PDL and below sm_90.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace spattn::cuda::ptx
