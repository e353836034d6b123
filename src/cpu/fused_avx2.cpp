// cpu/fused_avx2.cpp — the fused tile kernels built for AVX2 + FMA (8 floats per vector, 16 query rows per
// tile, register blocks sized for 16 ymm registers). Selected at run time where the CPU has AVX2 and FMA.
#include <cstddef>
#include <cstdint>
#include <utility>

#include "cpu/fused_kernel.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

#define SPATTN_ISA_NS avx2
#define SPATTN_ISA_NAME "avx2"
#define SPATTN_W 8
#define SPATTN_NR 6       // 6 keys x 2 vectors = 12 of the 16 ymm registers
#define SPATTN_NB 64
#define SPATTN_PV_MR 2    // 2 rows x 4 vectors = 8 accumulators + 4 V vectors
#define SPATTN_PV_NVC 4
#define SPATTN_FMA 1
#include "cpu/fused_kernels.inc"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else
namespace spattn::cpu::fused::avx2 {
const KernelSet& kernels() {
  static const KernelSet k{"avx2", 8, 16, 64, nullptr, nullptr, nullptr, nullptr};
  return k;
}
}  // namespace spattn::cpu::fused::avx2
#endif
