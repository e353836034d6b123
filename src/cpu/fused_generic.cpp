// cpu/fused_generic.cpp — the fused tile kernels for any target: 4-float vectors (SSE2 on x86-64, NEON on
// AArch64, scalar code elsewhere), 8 query rows per tile. The portable baseline.
#include <cstddef>
#include <cstdint>
#include <utility>

#include "cpu/fused_kernel.hpp"

#define SPATTN_ISA_NS generic
#define SPATTN_ISA_NAME "generic"
#define SPATTN_W 4
#define SPATTN_NR 6
#define SPATTN_NB 64
#define SPATTN_PV_MR 2
#define SPATTN_PV_NVC 4
#define SPATTN_FMA 0
#include "cpu/fused_kernels.inc"
