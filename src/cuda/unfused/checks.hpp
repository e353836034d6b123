// cuda/unfused/checks.hpp — the unfused handles' argument checks (host only: the plan's .cpp includes it through
// g++). CUDA errors: cuda/common/check.hpp.
#pragma once
#include <cstdint>
#include <string>

#include "cuda/unfused/kernels.hpp"
#include "spattn/error.hpp"

namespace spattn::unfused::detail {

inline void require(const Status& s, const char* kernel) {
  if (!s.ok) throw Error(std::string("unfused ") + kernel + ": " + s.reason);
}

// ---- host-side checks shared by the handles ---------------------------------------------------------
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline Status check_dense(const Dense& t, int64_t inner, DType dt, const char* name) {
  if (!t.data) return Status::fail(std::string(name) + ": null data pointer");
  if (!aligned16(t.data)) return Status::fail(std::string(name) + ": data pointer is not 16-byte aligned");
  const int64_t vec = 16 / dtype_size(dt);
  for (int64_t s : {t.sb, t.sl, t.sh})
    if (s % vec != 0)
      return Status::fail(std::string(name) + ": stride " + std::to_string(s) + " is not a multiple of " +
                             std::to_string(vec) + " elements (16-byte rows needed)");
  if (inner % vec != 0)
    return Status::fail(std::string(name) + ": head dim " + std::to_string(inner) + " is not a multiple of " +
                           std::to_string(vec));
  return Status::success();
}

inline Status check_shape(const Shape& s) {
  if (s.B < 1 || s.Hq < 1 || s.Hkv < 1 || s.Lq < 1 || s.Lk < 1 || s.D < 1 || s.Dv < 1)
    return Status::fail("problem sizes must be positive (B " + std::to_string(s.B) + ", Hq " +
                           std::to_string(s.Hq) + ", Hkv " + std::to_string(s.Hkv) + ", Lq " +
                           std::to_string(s.Lq) + ", Lk " + std::to_string(s.Lk) + ", D " + std::to_string(s.D) +
                           ", Dv " + std::to_string(s.Dv) + ")");
  if (s.Hq % s.Hkv != 0)
    return Status::fail("q_heads " + std::to_string(s.Hq) + " is not a multiple of kv_heads " +
                           std::to_string(s.Hkv));
  if (s.bh() > 65535 * 32) return Status::fail("batch * q_heads " + std::to_string(s.bh()) + " is too large");
  return Status::success();
}

// The preconditions every coarse (BSR, tensor-core) kernel shares: bf16/f16, block 32 or 64, a grid.y of B*Hq.
inline Status check_coarse(const Shape& s, int block, const char* op) {
  if (Status st = check_shape(s); !st) return st;
  if (s.dtype != DType::bf16 && s.dtype != DType::f16)
    return Status::fail(std::string("coarse ") + op + " runs on tensor cores: dtype " + std::string(dtype_name(s.dtype)) +
                           " is not bf16 or f16");
  if (block != 32 && block != 64) return Status::fail("block " + std::to_string(block) + " is not 32 or 64");
  if (s.bh() > 65535) return Status::fail("batch * q_heads " + std::to_string(s.bh()) + " > 65535");
  return Status::success();
}

inline unsigned grid_dim(int64_t n, const char* what) {
  if (n > 0x7fffffff) throw Error(std::string("unfused: grid of ") + what + " too large: " + std::to_string(n));
  return unsigned(n);
}

}  // namespace spattn::unfused::detail
