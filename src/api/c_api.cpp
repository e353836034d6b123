// api/c_api.cpp — a C entry to spattn::Plan for ctypes (bench/gpu_bench.py) and other languages.
// Every function returns 0 on success and -1 on failure (message: spattn_last_error()); nothing aborts.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "spattn/plan.hpp"
#include "spattn/runtime_mask.hpp"

namespace {
thread_local std::string g_last_error;

int fail(const char* what) {
  g_last_error = what;
  return -1;
}

template <class F>
int guarded(F&& f) {
  try {
    f();
    g_last_error.clear();
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  } catch (...) {
    return fail("unknown error");
  }
}

struct Handle {
  spattn::Plan plan;
  std::string explain, kernel, last_kernel, last_backward_kernel;
};

int64_t parse_int(std::string_view key, std::string_view text) {
  const std::string s(text);
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0') throw spattn::Error("option " + std::string(key) + "=" + s + ": not an integer");
  return v;
}

// "key=value,key=value": engine, kernel, threads, block_m, block_n, perm_d, persistent, split, compound, tile_map.
spattn::PlanOptions parse_options(const char* text) {
  spattn::PlanOptions o;
  std::string_view rest = text ? text : "";
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) throw spattn::Error("option '" + std::string(item) + "': expected key=value");
    const std::string_view key = item.substr(0, eq), val = item.substr(eq + 1);
    if (key == "engine") o.engine = spattn::parse_engine(val);
    else if (key == "kernel") o.kernel = std::string(val);
    else if (key == "threads") o.threads = int(parse_int(key, val));
    else if (key == "block_m") o.block_m = int(parse_int(key, val));
    else if (key == "block_n") o.block_n = int(parse_int(key, val));
    else if (key == "perm_d") o.perm_d = int(parse_int(key, val));
    else if (key == "persistent") o.persistent = int(parse_int(key, val));
    else if (key == "split") o.split = int(parse_int(key, val));
    else if (key == "compound") o.compound = int(parse_int(key, val));
    else if (key == "backward_kernel") o.backward_kernel = std::string(val);
    else if (key == "tile_map") o.tile_map = int(parse_int(key, val));
    else
      throw spattn::Error("option '" + std::string(key) +
                          "': expected engine, kernel, threads, block_m, block_n, perm_d, persistent, split, compound, "
                          "tile_map or backward_kernel");
  }
  return o;
}

spattn::DType dtype_of(int code) {
  switch (code) {
    case 0: return spattn::DType::bf16;
    case 1: return spattn::DType::f16;
    case 2: return spattn::DType::f32;
  }
  throw spattn::Error("dtype code " + std::to_string(code) + ": expected 0 (bf16), 1 (fp16) or 2 (fp32)");
}
}  // namespace

// One index tensor, the C form of spattn::IndexView: data null where absent; bits 32 or 64; strides in elements.
typedef struct {
  const void* data;
  int32_t bits;
  int32_t ndim;
  int64_t shape[4];
  int64_t stride[4];
} spattn_index_view;

namespace {
// slots[0..6]: kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, cu_seqlens_q, cu_seqlens_k,
// topk_indices (spattn::RuntimeMask::slot); null slots: none.
spattn::RuntimeMask mask_of(const spattn_index_view* slots, int check) {
  spattn::RuntimeMask m;
  m.check = (check & 1) != 0;
  m.no_host = (check & 2) != 0;
  if (!slots) return m;
  for (int i = 0; i < spattn::RuntimeMask::kSlots; ++i) {
    const spattn_index_view& s = slots[i];
    spattn::IndexView& v = m.slot(i);
    v.data = s.data, v.bits = s.bits, v.ndim = s.ndim;
    for (int d = 0; d < 4; ++d) v.shape[size_t(d)] = s.shape[d], v.stride[size_t(d)] = s.stride[d];
  }
  return m;
}

int forward_impl(void* handle, const void* q, const int64_t* q_strides, const void* k, const int64_t* k_strides,
                 const void* v, const int64_t* v_strides, void* o, const int64_t* o_strides, float* lse,
                 const spattn_index_view* slots, int check, void* stream) {
  return guarded([&] {
    const auto& plan = static_cast<Handle*>(handle)->plan;
    const spattn::Problem& pr = plan.problem();
    const bool cpu = plan.device().kind == spattn::Device::Kind::cpu;
    auto view = [&](const void* p, const int64_t* s, int64_t L, int64_t H, int64_t D, spattn::DType t) {
      return spattn::TensorView{const_cast<void*>(p), t, {pr.batch, L, H, D}, {s[0], s[1], s[2], s[3]}};
    };
    spattn::TensorView lv{
        lse, spattn::DType::f32, {pr.batch, pr.q_heads, pr.q_len, 1}, {pr.q_heads * pr.q_len, pr.q_len, 1, 1}};
    const spattn::TensorView args[5] = {
        view(q, q_strides, pr.q_len, pr.q_heads, pr.head_dim, pr.dtype),
        view(k, k_strides, pr.kv_len, pr.kv_heads, pr.head_dim, pr.dtype),
        view(v, v_strides, pr.kv_len, pr.kv_heads, pr.dv(), pr.dtype),
        view(o, o_strides, pr.q_len, pr.q_heads, pr.dv(), cpu ? spattn::DType::f32 : pr.dtype), lv};
    if (slots)
      plan.forward(args[0], args[1], args[2], args[3], args[4], mask_of(slots, check), stream);
    else
      plan.forward(args[0], args[1], args[2], args[3], args[4], stream);
  });
}

int backward_impl(void* handle, const void* q, const int64_t* q_strides, const void* k, const int64_t* k_strides,
                  const void* v, const int64_t* v_strides, const void* o, const int64_t* o_strides, const float* lse,
                  const void* dout, const int64_t* dout_strides, void* dq, const int64_t* dq_strides, void* dk,
                  const int64_t* dk_strides, void* dv, const int64_t* dv_strides, const spattn_index_view* slots,
                  int check, void* stream) {
  return guarded([&] {
    const auto& plan = static_cast<Handle*>(handle)->plan;
    const spattn::Problem& pr = plan.problem();
    const bool cpu = plan.device().kind == spattn::Device::Kind::cpu;
    const spattn::DType out = cpu ? spattn::DType::f32 : pr.dtype;
    auto view = [&](const void* p, const int64_t* s, int64_t L, int64_t H, int64_t D, spattn::DType t) {
      return spattn::TensorView{const_cast<void*>(p), t, {pr.batch, L, H, D}, {s[0], s[1], s[2], s[3]}};
    };
    const spattn::TensorView lv{const_cast<float*>(lse),
                                spattn::DType::f32,
                                {pr.batch, pr.q_heads, pr.q_len, 1},
                                {pr.q_heads * pr.q_len, pr.q_len, 1, 1}};
    const spattn::TensorView a[9] = {view(q, q_strides, pr.q_len, pr.q_heads, pr.head_dim, pr.dtype),
                                     view(k, k_strides, pr.kv_len, pr.kv_heads, pr.head_dim, pr.dtype),
                                     view(v, v_strides, pr.kv_len, pr.kv_heads, pr.dv(), pr.dtype),
                                     view(o, o_strides, pr.q_len, pr.q_heads, pr.dv(), out),
                                     lv,
                                     view(dout, dout_strides, pr.q_len, pr.q_heads, pr.dv(), pr.dtype),
                                     view(dq, dq_strides, pr.q_len, pr.q_heads, pr.head_dim, out),
                                     view(dk, dk_strides, pr.kv_len, pr.kv_heads, pr.head_dim, out),
                                     view(dv, dv_strides, pr.kv_len, pr.kv_heads, pr.dv(), out)};
    if (slots)
      plan.backward(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], mask_of(slots, check), stream);
    else
      plan.backward(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], stream);
  });
}
}  // namespace

extern "C" {

const char* spattn_last_error(void) { return g_last_error.c_str(); }

// Plans `spec` for one problem on `device` (-1: the CPU, i >= 0: CUDA device i). dtype: 0 bf16, 1 fp16, 2 fp32.
// scale: NaN = 1/sqrt(head_dim) (the default); any other value is the scale itself, 0 included (uniform attention
// over each row's keys). options: null or "key=value,...": engine (auto, cpu, cuda_fused, cuda_unfused,
// reference), kernel (a kernel-table row or kind: sm80, sm90_cp, sm90_tma, sm90_band, sm90_band_rmax), threads,
// block_m, block_n, perm_d, persistent, split, compound, tile_map (parse_options above).
int spattn_plan_create(const char* spec, int device, int dtype, int64_t batch, int64_t q_heads, int64_t kv_heads,
                       int64_t q_len, int64_t k_len, int64_t head_dim, double scale, const char* options, void** out) {
  if (!spec || !out) return fail("spattn_plan_create: null argument");
  *out = nullptr;
  return guarded([&] {
    spattn::Problem pr;
    pr.batch = batch;
    pr.q_heads = q_heads;
    pr.kv_heads = kv_heads;
    pr.q_len = q_len;
    pr.kv_len = k_len;
    pr.head_dim = head_dim;
    pr.dtype = dtype_of(dtype);
    if (!std::isnan(scale)) pr.scale = scale;
    const spattn::Device dev = device < 0 ? spattn::Device::cpu() : spattn::Device::cuda(device);
    auto h = std::make_unique<Handle>();
    h->plan = spattn::make_plan(spattn::parse(spec), pr, dev, parse_options(options));
    h->explain = h->plan.explain();
    h->kernel = h->plan.kernel();
    *out = h.release();
  });
}

void spattn_plan_destroy(void* handle) { delete static_cast<Handle*>(handle); }

// info[0..3] = nnz (all query heads), plan time in microseconds, engine (0 cpu, 1 cuda_fused, 2 cuda_unfused,
// 3 reference), 0
int spattn_plan_info(void* handle, int64_t* info) {
  if (!handle || !info) return fail("spattn_plan_info: null argument");
  return guarded([&] {
    const auto& p = static_cast<Handle*>(handle)->plan;
    info[0] = p.nnz();
    info[1] = int64_t(p.plan_ms() * 1000.0);
    info[2] = int64_t(p.engine()) - 1;
    info[3] = 0;
  });
}

const char* spattn_plan_explain(void* handle) { return handle ? static_cast<Handle*>(handle)->explain.c_str() : ""; }
const char* spattn_plan_kernel(void* handle) { return handle ? static_cast<Handle*>(handle)->kernel.c_str() : ""; }
const char* spattn_plan_last_kernel(void* handle) {
  if (!handle) return "";
  auto* h = static_cast<Handle*>(handle);
  h->last_kernel = h->plan.last_kernel();
  return h->last_kernel.c_str();
}
const char* spattn_plan_last_backward_kernel(void* handle) {
  if (!handle) return "";
  auto* h = static_cast<Handle*>(handle);
  h->last_backward_kernel = h->plan.last_backward_kernel();
  return h->last_backward_kernel.c_str();
}

// Forward. Strides in elements, 4 each ({batch, seq, head, dim}) for q, k, v and o, in the plan's layout
// [B, L, H, D]; q/k/v in the plan's dtype; o in the plan's dtype on the GPU (fp32 on the CPU); lse [B, Hq, Lq]
// contiguous fp32 or null. stream: a cudaStream_t or null (ignored on the CPU).
int spattn_plan_forward(void* handle, const void* q, const int64_t* q_strides, const void* k, const int64_t* k_strides,
                        const void* v, const int64_t* v_strides, void* o, const int64_t* o_strides, float* lse,
                        void* stream) {
  if (!handle || !q_strides || !k_strides || !v_strides || !o_strides)
    return fail("spattn_plan_forward: null argument");
  return forward_impl(handle, q, q_strides, k, k_strides, v, v_strides, o, o_strides, lse, nullptr, 0, stream);
}

// Backward: dq, dk, dv (strides as in forward; the plan's dtype on the GPU, fp32 on the CPU) from dout, with the
// forward's o and lse (contiguous fp32 [B, Hq, Lq]; the CPU engines also accept null for both).
int spattn_plan_backward(void* handle, const void* q, const int64_t* q_strides, const void* k, const int64_t* k_strides,
                         const void* v, const int64_t* v_strides, const void* o, const int64_t* o_strides,
                         const float* lse, const void* dout, const int64_t* dout_strides, void* dq,
                         const int64_t* dq_strides, void* dk, const int64_t* dk_strides, void* dv,
                         const int64_t* dv_strides, void* stream) {
  if (!handle || !q_strides || !k_strides || !v_strides || !o_strides || !dout_strides || !dq_strides || !dk_strides ||
      !dv_strides)
    return fail("spattn_plan_backward: null argument");
  return backward_impl(handle, q, q_strides, k, k_strides, v, v_strides, o, o_strides, lse, dout, dout_strides, dq,
                       dq_strides, dk, dk_strides, dv, dv_strides, nullptr, 0, stream);
}

// ---- run-time masks (spattn/runtime_mask.hpp) ----

// A plan whose mask comes at every call: `mask` is the layout's text ("blocks:128x128:causal", "documents:causal",
// "topk:2048:local(left=64, right=0)"); the rest as spattn_plan_create (scale NaN: the default).
int spattn_plan_create_masked(const char* mask, int device, int dtype, int64_t batch, int64_t q_heads,
                              int64_t kv_heads, int64_t q_len, int64_t k_len, int64_t head_dim, double scale,
                              const char* options, void** out) {
  if (!mask || !out) return fail("spattn_plan_create_masked: null argument");
  *out = nullptr;
  return guarded([&] {
    spattn::Problem pr;
    pr.batch = batch, pr.q_heads = q_heads, pr.kv_heads = kv_heads, pr.q_len = q_len, pr.kv_len = k_len;
    pr.head_dim = head_dim, pr.dtype = dtype_of(dtype);
    if (!std::isnan(scale)) pr.scale = scale;
    const spattn::Device dev = device < 0 ? spattn::Device::cpu() : spattn::Device::cuda(device);
    auto h = std::make_unique<Handle>();
    h->plan = spattn::make_plan(spattn::MaskLayout::parse(mask), pr, dev, parse_options(options));
    h->explain = h->plan.explain();
    h->kernel = h->plan.kernel();
    *out = h.release();
  });
}


// spattn_plan_forward with the call's mask: `slots` points at 7 spattn_index_view (kv_num_blocks, kv_indices,
// full_kv_num_blocks, full_kv_indices, cu_seqlens_q, cu_seqlens_k, topk_indices; data null where absent); `check`
// flags: bit 1 runs the checking mode (RuntimeMask::check), bit 2 refuses the host path (RuntimeMask::no_host).
int spattn_plan_forward_masked(void* handle, const void* q, const int64_t* q_strides, const void* k,
                               const int64_t* k_strides, const void* v, const int64_t* v_strides, void* o,
                               const int64_t* o_strides, float* lse, const spattn_index_view* slots, int check,
                               void* stream) {
  if (!slots) return fail("spattn_plan_forward_masked: null slots");
  return forward_impl(handle, q, q_strides, k, k_strides, v, v_strides, o, o_strides, lse, slots, check, stream);
}

// spattn_plan_backward with the call's mask (slots and check as spattn_plan_forward_masked).
int spattn_plan_backward_masked(void* handle, const void* q, const int64_t* q_strides, const void* k,
                                const int64_t* k_strides, const void* v, const int64_t* v_strides, const void* o,
                                const int64_t* o_strides, const float* lse, const void* dout,
                                const int64_t* dout_strides, void* dq, const int64_t* dq_strides, void* dk,
                                const int64_t* dk_strides, void* dv, const int64_t* dv_strides,
                                const spattn_index_view* slots, int check, void* stream) {
  if (!slots) return fail("spattn_plan_backward_masked: null slots");
  return backward_impl(handle, q, q_strides, k, k_strides, v, v_strides, o, o_strides, lse, dout, dout_strides, dq,
                       dq_strides, dk, dk_strides, dv, dv_strides, slots, check, stream);
}

// Dense 0/1 mask of rows [q_begin, q_end) of `spec` bound to (q_len, k_len), written to out[(q - q_begin) *
// k_len + k] (uint8). From the pattern's row enumeration (the semantics' one source of truth).
int spattn_pattern_mask(const char* spec, int64_t q_len, int64_t k_len, int64_t q_begin, int64_t q_end, uint8_t* out) {
  if (!spec || !out) return fail("spattn_pattern_mask: null argument");
  return guarded([&] {
    const auto bound = spattn::parse(spec).bind(q_len, k_len);
    if (q_begin < 0 || q_end > q_len || q_begin > q_end)
      throw spattn::Error("spattn_pattern_mask: row range [" + std::to_string(q_begin) + ", " + std::to_string(q_end) +
                          ") is not inside [0, " + std::to_string(q_len) + "]");
    std::memset(out, 0, size_t(q_end - q_begin) * size_t(k_len));
    std::vector<int64_t> keys;
    for (int64_t q = q_begin; q < q_end; ++q) {
      bound.row_keys(q, keys);
      uint8_t* row = out + size_t(q - q_begin) * size_t(k_len);
      for (int64_t kk : keys) row[kk] = 1;
    }
  });
}

int spattn_pattern_nnz(const char* spec, int64_t q_len, int64_t k_len, int64_t* nnz) {
  if (!spec || !nnz) return fail("spattn_pattern_nnz: null argument");
  return guarded([&] { *nnz = spattn::parse(spec).bind(q_len, k_len).nnz(); });
}

}  // extern "C"
