// cpu/fused_avx512.cpp — the fused tile kernels built for AVX-512 (16 floats per vector, 32 query rows per
// tile). Selected at run time only where the CPU has AVX-512F/VL/BW/DQ (see fused.cpp).
#include <cstddef>
#include <cstdint>
#include <utility>

#include "cpu/fused_kernel.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12: _mm512_undefined_ps in max/min
#endif

#define SPATTN_ISA_NS avx512
#define SPATTN_ISA_NAME "avx512"
#define SPATTN_W 16
#define SPATTN_NR 8       // 8 keys x 2 vectors = 16 of the 32 zmm registers for QK^T accumulators
#define SPATTN_NB 64
#define SPATTN_PV_MR 4    // 4 rows x 4 vectors (Dv = 64) = 16 accumulators
#define SPATTN_PV_NVC 4
#define SPATTN_FMA 1
#include "cpu/fused_kernels.inc"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else
namespace spattn::cpu::fused::avx512 {
const KernelSet& kernels() {
  static const KernelSet k{"avx512", 16, 32, 64, nullptr, nullptr, nullptr, nullptr};
  return k;
}
}  // namespace spattn::cpu::fused::avx512
#endif
