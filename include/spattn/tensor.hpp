// spattn/tensor.hpp — dtypes, half-precision conversions, strided 4-D tensor views, the Problem.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "spattn/error.hpp"

namespace spattn {

enum class DType : uint8_t { f32, f16, bf16, f64 };

std::string_view dtype_name(DType t);
DType parse_dtype(std::string_view name);  // "fp32"|"f32"|"float32", "fp16"|..., "bf16"|...; throws Error
inline int dtype_size(DType t) { return t == DType::f64 ? 8 : t == DType::f32 ? 4 : 2; }

// ---- scalar conversions (bf16 is stored as raw 16-bit words; round to nearest even on the way in) ----
inline float bf16_to_float(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);

// A strided view of a 4-D tensor. Strides are in elements. Default layout [B, L, H, D] row-major.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::array<int64_t, 4> shape{0, 0, 0, 0};
  std::array<int64_t, 4> stride{0, 0, 0, 0};

  static TensorView contiguous(void* data, DType dtype, std::array<int64_t, 4> shape) {
    TensorView t{data, dtype, shape, {}};
    t.stride[3] = 1;
    for (int i = 2; i >= 0; --i) t.stride[i] = t.stride[i + 1] * shape[i + 1];
    return t;
  }
  // The view of index `i` along `axis` (kept as a dimension of size 1): one head, one batch element.
  TensorView narrow(int axis, int64_t i) const {
    TensorView s = *this;
    if (!s.data) return s;
    s.data = static_cast<char*>(s.data) + i * s.stride[size_t(axis)] * dtype_size(s.dtype);
    s.shape[size_t(axis)] = 1;
    return s;
  }
  // The view of indices [begin, end) along `axis`: a range of rows.
  TensorView slice(int axis, int64_t begin, int64_t end) const {
    TensorView s = narrow(axis, begin);
    s.shape[size_t(axis)] = end - begin;
    return s;
  }
  int64_t offset(int64_t a, int64_t b, int64_t c, int64_t d) const {
    return a * stride[0] + b * stride[1] + c * stride[2] + d * stride[3];
  }
  // Reads element (a, b, c, d) as double, whatever the dtype.
  double load(int64_t a, int64_t b, int64_t c, int64_t d) const {
    const int64_t o = offset(a, b, c, d);
    switch (dtype) {
      case DType::f32: return static_cast<const float*>(data)[o];
      case DType::f64: return static_cast<const double*>(data)[o];
      case DType::f16: return half_to_float(static_cast<const uint16_t*>(data)[o]);
      case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(data)[o]);
    }
    return 0;
  }
  void store(int64_t a, int64_t b, int64_t c, int64_t d, double v) const {
    const int64_t o = offset(a, b, c, d);
    switch (dtype) {
      case DType::f32: static_cast<float*>(data)[o] = float(v); break;
      case DType::f64: static_cast<double*>(data)[o] = v; break;
      case DType::f16: static_cast<uint16_t*>(data)[o] = float_to_half(float(v)); break;
      case DType::bf16: static_cast<uint16_t*>(data)[o] = float_to_bf16(float(v)); break;
    }
  }
};

// The size in bytes of an array of `dims` elements of `elem_bytes` each, checked: throws Error naming `what`, the
// dims and the limit when the product does not fit in 63 bits (every size built from user-given dimensions goes
// through here before anything is allocated).
int64_t checked_bytes(std::string_view what, const std::vector<int64_t>& dims, int64_t elem_bytes);

// One attention problem. Q is [B, Lq, Hq, D]; K is [B, Lk, Hkv, D]; V is [B, Lk, Hkv, Dv];
// O is [B, Lq, Hq, Dv]; LSE is [B, Hq, Lq] (natural log). Hq % Hkv == 0 (grouped-query attention).
struct Problem {
  int64_t batch = 1;
  int64_t q_heads = 1;
  int64_t kv_heads = 1;
  int64_t q_len = 0;
  int64_t kv_len = 0;
  int64_t head_dim = 64;
  int64_t value_dim = 0;  // 0: same as head_dim
  DType dtype = DType::f32;
  std::optional<double> scale;  // none: 1 / sqrt(head_dim); 0 is a scale like any other (uniform attention)

  int64_t dv() const { return value_dim ? value_dim : head_dim; }
  double softmax_scale() const { return scale ? *scale : 1.0 / std::sqrt(double(head_dim)); }
  // Throws Error naming the first inconsistent field, or the first tensor whose size overflows (checked_bytes).
  void validate() const;
  // Checks a view against an expected shape; `what` names the tensor in the error ("q", "k", ...).
  static void check_view(const TensorView& t, std::string_view what, std::array<int64_t, 4> shape);
  // check_view of every tensor of a backward pass: q, k, v, dout and the gradients dq, dk, dv; and the gradients'
  // dtype (fp32 or fp64: the CPU engines'), where `cpu_grads`.
  void check_backward_views(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout,
                            const TensorView& dq, const TensorView& dk, const TensorView& dv, bool cpu_grads) const;
};

}  // namespace spattn
