// dtypes, half-precision conversion, problem validation.
#include <cstring>
#include <string>
#include <vector>

#include "spattn/tensor.hpp"

namespace spattn {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "fp32";
    case DType::f16: return "fp16";
    case DType::bf16: return "bf16";
    case DType::f64: return "fp64";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  if (s == "fp32" || s == "f32" || s == "float32" || s == "float") return DType::f32;
  if (s == "fp16" || s == "f16" || s == "float16" || s == "half") return DType::f16;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "fp64" || s == "f64" || s == "float64" || s == "double") return DType::f64;
  throw Error("unsupported dtype '" + std::string(s) + "' (use fp32, fp16 or bf16)");
}

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(man & 0x400u)) {
        man <<= 1;
        --exp;
      }
      man &= 0x3ffu;
      u = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (absu >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // overflow (>= 65520 rounds to inf)
  if (absu < 0x38800000u) {                                 // subnormal or zero in half
    if (absu < 0x33000000u) return uint16_t(sign);          // < 2^-25 rounds to 0
    const uint32_t e = absu >> 23, m = (absu & 0x7fffffu) | 0x800000u;
    const int shift = int(126 - e);  // 14..24: the value m * 2^(e - 150) is m >> shift in units of 2^-24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t r = ((absu >> 13) - ((127 - 15) << 10));
  const uint32_t rem = absu & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) ++r;
  return uint16_t(sign | r);
}

void Problem::check_view(const TensorView& t, std::string_view what, std::array<int64_t, 4> shape) {
  auto str = [](const std::array<int64_t, 4>& s) {
    return "[" + std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " + std::to_string(s[2]) + ", " + std::to_string(s[3]) + "]";
  };
  for (int i = 0; i < 4; ++i)
    if (t.shape[size_t(i)] != shape[size_t(i)])
      throw Error(std::string(what) + ": dimension " + std::to_string(i) + " is " + std::to_string(t.shape[size_t(i)]) +
                  ", expected " + std::to_string(shape[size_t(i)]) + " (shape " + str(t.shape) + ", expected " +
                  str(shape) + ")");
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  if (numel > 0 && !t.data) throw Error(std::string(what) + " has no data pointer");
}

void Problem::check_backward_views(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& dout, const TensorView& dq, const TensorView& dk,
                                   const TensorView& dv, bool cpu_grads) const {
  check_view(q, "q", {batch, q_len, q_heads, head_dim});
  check_view(k, "k", {batch, kv_len, kv_heads, head_dim});
  const int64_t value = this->dv();  // (the parameter dv hides the member)
  check_view(v, "v", {batch, kv_len, kv_heads, value});
  check_view(dout, "dout", {batch, q_len, q_heads, value});
  check_view(dq, "dq", {batch, q_len, q_heads, head_dim});
  check_view(dk, "dk", {batch, kv_len, kv_heads, head_dim});
  check_view(dv, "dv", {batch, kv_len, kv_heads, value});
  for (auto [t, name] : {std::pair{&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}})
    if (cpu_grads && t->dtype != DType::f32 && t->dtype != DType::f64)
      throw Error(std::string("gradient ") + name + " must be fp32 or fp64 on the CPU, got " +
                  std::string(dtype_name(t->dtype)));
}

int64_t checked_bytes(std::string_view what, const std::vector<int64_t>& dims, int64_t elem_bytes) {
  int64_t n = elem_bytes;
  bool overflow = false, negative = false;
  for (int64_t d : dims) negative |= d < 0, overflow |= __builtin_mul_overflow(n, d, &n);
  if (overflow || negative) {
    std::string s;
    for (int64_t d : dims) s += (s.empty() ? "" : ", ") + std::to_string(d);
    throw Error(std::string(what) + " = [" + s + "] " +
                (negative ? "has a negative dimension" : "is too large: its size passes 2^63 - 1 bytes"));
  }
  return n;
}

void Problem::validate() const {
  auto need = [](bool ok, const std::string& msg) {
    if (!ok) throw Error(msg);
  };
  need(batch >= 1, "batch must be at least 1, got " + std::to_string(batch));
  need(q_heads >= 1, "heads must be at least 1, got " + std::to_string(q_heads));
  need(kv_heads >= 1, "kv heads must be at least 1, got " + std::to_string(kv_heads));
  need(q_heads % kv_heads == 0, "heads (" + std::to_string(q_heads) + ") must be a multiple of kv heads (" + std::to_string(kv_heads) + ")");
  need(q_len >= 0, "query length must not be negative, got " + std::to_string(q_len));
  need(kv_len >= 0, "key length must not be negative, got " + std::to_string(kv_len));
  need(head_dim >= 1, "head dim must be at least 1, got " + std::to_string(head_dim));
  need(value_dim >= 0, "value dim must not be negative, got " + std::to_string(value_dim));
  need(!scale || std::isfinite(*scale), "scale must be finite, got " + std::to_string(scale.value_or(0)));
  // Heads first: B * H counts work items and lse rows even when a length is 0.
  const int64_t in = dtype_size(dtype), out = 8;  // outputs: fp32, or fp64 from the reference
  checked_bytes("q [B, H, Lq, D]", {batch, q_heads, q_len, head_dim}, in);
  checked_bytes("k [B, Hkv, Lk, D]", {batch, kv_heads, kv_len, head_dim}, in);
  checked_bytes("v [B, Hkv, Lk, Dv]", {batch, kv_heads, kv_len, dv()}, in);
  checked_bytes("o [B, H, Lq, Dv]", {batch, q_heads, q_len, dv()}, out);
}

}  // namespace spattn
