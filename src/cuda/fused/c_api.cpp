// cuda/fused/c_api.cu — a C entry to the fused kernel for ctypes (bench/gpu_bench.py) and other languages.
// Every function returns 0 on success and -1 on failure (message: spattn_last_error()); nothing aborts.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "spattn/fused.hpp"

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
  spattn::FusedAttention attn;
  std::string explain;
};
}  // namespace

extern "C" {

const char* spattn_last_error(void) { return g_last_error.c_str(); }

// Builds the plan of `spec` bound to (q_len, k_len) and uploads it to the current device.
// block_m/block_n: 0 = chosen; perm_d: -1 = chosen, 1 = none; force_sm80: bit 0 runs the mma.sync kernel,
// bit 1 keeps the sm_90a cp.async kernels where the warp-specialized TMA kernel would apply, bit 2 (4) runs the
// TMA kernel with persistent CTAs, bit 3 (8) with one work item a CTA (neither: chosen), bit 4 (16) the band
// kernel for band-row plans, bit 5 (32) never the band kernel (neither: chosen), bit 6 (64) never split the
// band kernel's last work items, bit 7 (128) split the last items into 3 parts each, bit 8 (256) run the last
// items as single 64-row slabs (none of bits 6-8: chosen), bit 9 (512) the band kernel's running-max steps, bit 10
// (1024) never those (neither: chosen).
int spattn_fused_create(const char* spec, int64_t q_len, int64_t k_len, int64_t head_dim, int block_m, int block_n,
                        int perm_d, int force_sm80, void** out) {
  if (!spec || !out) return fail("spattn_fused_create: null argument");
  *out = nullptr;
  return guarded([&] {
    const auto bound = spattn::parse(spec).bind(q_len, k_len);
    spattn::FusedOptions opt;
    opt.block_m = block_m;
    opt.block_n = block_n;
    opt.perm_d = perm_d;
    opt.force_sm80 = (force_sm80 & 1) != 0;
    opt.tma = (force_sm80 & 2) == 0;
    opt.persistent = (force_sm80 & 4) ? 1 : (force_sm80 & 8) ? 0 : -1;
    opt.band = (force_sm80 & 16) ? 1 : (force_sm80 & 32) ? 0 : -1;
    opt.split = (force_sm80 & 64) ? 0 : (force_sm80 & 128) ? 3 : (force_sm80 & 256) ? 1 : -1;
    opt.running_max = (force_sm80 & 512) ? 1 : (force_sm80 & 1024) ? 0 : -1;
    auto* h = new Handle{spattn::FusedAttention(bound, head_dim, opt), {}};
    h->explain = h->attn.explain();
    *out = h;
  });
}

void spattn_fused_destroy(void* handle) { delete static_cast<Handle*>(handle); }

// info[0..5] = nnz, block_m, block_n, perm_d, plan_ms * 1000 (microseconds), 0
int spattn_fused_info(void* handle, int64_t* info) {
  if (!handle || !info) return fail("spattn_fused_info: null argument");
  auto* h = static_cast<Handle*>(handle);
  info[0] = h->attn.nnz();
  info[1] = h->attn.block_m();
  info[2] = h->attn.block_n();
  info[3] = h->attn.perm_d();
  info[4] = int64_t(h->attn.plan_ms() * 1000.0);
  info[5] = 0;
  return 0;
}

const char* spattn_fused_explain(void* handle) { return handle ? static_cast<Handle*>(handle)->explain.c_str() : ""; }

// Forward on device pointers. dtype: 0 = bf16, 1 = fp16. Strides in elements: {batch, seq, head} for
// q (and o: o_strides), k, v; the head dim is contiguous. lse: [B, Hq, Lq] contiguous fp32 or null.
// scale: 0 = 1/sqrt(D). stream: a cudaStream_t or null.
int spattn_fused_forward(void* handle, int dtype, int64_t batch, int64_t q_heads, int64_t kv_heads, int64_t q_len,
                         int64_t k_len, int64_t head_dim, const void* q, const int64_t* q_strides, const void* k,
                         const int64_t* k_strides, const void* v, const int64_t* v_strides, void* o,
                         const int64_t* o_strides, float* lse, double scale, void* stream) {
  if (!handle || !q_strides || !k_strides || !v_strides || !o_strides) return fail("spattn_fused_forward: null argument");
  if (dtype != 0 && dtype != 1) return fail("spattn_fused_forward: dtype must be 0 (bf16) or 1 (fp16)");
  return guarded([&] {
    auto* h = static_cast<Handle*>(handle);
    spattn::Problem pr;
    pr.batch = batch;
    pr.q_heads = q_heads;
    pr.kv_heads = kv_heads;
    pr.q_len = q_len;
    pr.kv_len = k_len;
    pr.head_dim = head_dim;
    pr.dtype = dtype == 0 ? spattn::DType::bf16 : spattn::DType::f16;
    pr.scale = scale;
    auto view = [&](const void* p, const int64_t* s, int64_t L, int64_t H) {
      return spattn::TensorView{const_cast<void*>(p), pr.dtype, {batch, L, H, head_dim}, {s[0], s[1], s[2], 1}};
    };
    spattn::TensorView lv{lse, spattn::DType::f32, {batch, q_heads, q_len, 1}, {q_heads * q_len, q_len, 1, 1}};
    if (!lse) lv = spattn::TensorView{nullptr, spattn::DType::f32, {batch, q_heads, q_len, 1}, {0, 0, 0, 0}};
    h->attn.run(pr, view(q, q_strides, q_len, q_heads), view(k, k_strides, k_len, kv_heads),
                view(v, v_strides, k_len, kv_heads), view(o, o_strides, q_len, q_heads), lv, stream);
  });
}

// Dense 0/1 mask of rows [q_begin, q_end) of `spec` bound to (q_len, k_len), written to out[(q - q_begin) *
// k_len + k] (uint8). From the pattern's row enumeration (the semantics' one source of truth).
int spattn_pattern_mask(const char* spec, int64_t q_len, int64_t k_len, int64_t q_begin, int64_t q_end, uint8_t* out) {
  if (!spec || !out) return fail("spattn_pattern_mask: null argument");
  return guarded([&] {
    const auto bound = spattn::parse(spec).bind(q_len, k_len);
    if (q_begin < 0 || q_end > q_len || q_begin > q_end) throw spattn::Error("spattn_pattern_mask: bad row range");
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
