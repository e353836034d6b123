// cuda/backward/csr_backward.cu — see csr_backward.hpp.
#include "cuda/backward/csr_backward.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <sstream>
#include <vector>

#include "cuda/backward/columns_backward.hpp"
#include "cuda/backward/scattered_backward.hpp"
#include "cuda/backward/tile_backward.hpp"
#include "cuda/common/check.hpp"
#include "cuda/common/device.hpp"
#include "cuda/common/patterns_backward.hpp"
#include "plan/kernels.hpp"
#include "plan/key_plan.hpp"
#include "spattn/format.hpp"

namespace spattn::cuda {
namespace {

constexpr int kMaxPerLane = 8;  // head dims up to 256

struct View {
  const void* p;
  int64_t sb, sl, sh;
};
struct Args {
  View q, k, v, o, dout;
  void *dq, *dk, *dv;
  int64_t dq_sb, dq_sl, dq_sh, dk_sb, dk_sl, dk_sh, dv_sb, dv_sl, dv_sh;
  const float* lse;  // [B, Hq, Lq] with strides lse_sb, lse_sh (query axis contiguous)
  float* delta;      // [B, Hq, Lq] with strides delta_sb, delta_sh
  int64_t lse_sb, lse_sh, delta_sb, delta_sh;
  int B, H, group, Lq, Lk, D, Dv;
  float scale;
  int accumulate;  // 1: the gradients added to dq, dk, dv's contents
  const int64_t* row_off;
  const int32_t* cols;
  const int64_t* col_off;
  const int32_t* rows;
};

template <class T>
__device__ float ld(const void* p, int64_t i) {
  if constexpr (std::is_same_v<T, float>) return static_cast<const float*>(p)[i];
  else if constexpr (std::is_same_v<T, __half>) return __half2float(static_cast<const __half*>(p)[i]);
  else return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}
template <class T>
__device__ void st(void* p, int64_t i, float x) {
  if constexpr (std::is_same_v<T, float>) static_cast<float*>(p)[i] = x;
  else if constexpr (std::is_same_v<T, __half>) static_cast<__half*>(p)[i] = __float2half_rn(x);
  else static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x);
}
// Writes x, or adds it to what is there (acc).
template <class T>
__device__ void put(void* p, int64_t i, float x, int acc) {
  st<T>(p, i, acc ? x + ld<T>(p, i) : x);
}
__device__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
// A row of `n` elements (lane l holds elements l, l + 32, ...).
template <class T>
__device__ void load_row(const void* p, int64_t base, int n, float (&r)[kMaxPerLane]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int t = 0; t < kMaxPerLane; ++t) r[t] = lane + 32 * t < n ? ld<T>(p, base + lane + 32 * t) : 0.f;
}
__device__ float dot(const float (&a)[kMaxPerLane], const float (&b)[kMaxPerLane]) {
  float s = 0;
#pragma unroll
  for (int t = 0; t < kMaxPerLane; ++t) s += a[t] * b[t];
  return warp_sum(s);
}

// A warp per (b, h, query row): delta = dout . o, dq = scale * sum_j P (dP - delta) k_j.
template <class T>
__global__ void dq_kernel(Args a) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (w >= int64_t(a.B) * a.H * a.Lq) return;
  const int i = int(w % a.Lq), h = int((w / a.Lq) % a.H), b = int(w / (int64_t(a.Lq) * a.H)), hk = h / a.group;
  const int lane = threadIdx.x & 31;
  float qr[kMaxPerLane], dor[kMaxPerLane], orow[kMaxPerLane], kr[kMaxPerLane], vr[kMaxPerLane], acc[kMaxPerLane] = {};
  load_row<T>(a.q.p, b * a.q.sb + i * a.q.sl + h * a.q.sh, a.D, qr);
  load_row<T>(a.dout.p, b * a.dout.sb + i * a.dout.sl + h * a.dout.sh, a.Dv, dor);
  load_row<T>(a.o.p, b * a.o.sb + i * a.o.sl + h * a.o.sh, a.Dv, orow);
  const float delta = dot(dor, orow);
  const int64_t li = b * a.lse_sb + h * a.lse_sh + i;
  const float lse = a.lse[li];
  if (lane == 0) a.delta[b * a.delta_sb + h * a.delta_sh + i] = delta;
  for (int64_t e = a.row_off[i]; e < a.row_off[i + 1]; ++e) {
    const int j = a.cols[e];
    load_row<T>(a.k.p, b * a.k.sb + j * a.k.sl + hk * a.k.sh, a.D, kr);
    load_row<T>(a.v.p, b * a.v.sb + j * a.v.sl + hk * a.v.sh, a.Dv, vr);
    const float p = __expf(a.scale * dot(qr, kr) - lse);
    const float ds = p * (dot(dor, vr) - delta) * a.scale;
#pragma unroll
    for (int t = 0; t < kMaxPerLane; ++t) acc[t] += ds * kr[t];
  }
#pragma unroll
  for (int t = 0; t < kMaxPerLane; ++t)
    if (lane + 32 * t < a.D) put<T>(a.dq, b * a.dq_sb + i * a.dq_sl + h * a.dq_sh + lane + 32 * t, acc[t], a.accumulate);
}

// A warp per (b, kv head, key row): over the query heads of its group and the queries that keep the key,
// dv = sum P dout_i, dk = scale * sum P (dP - delta_i) q_i.
template <class T>
__global__ void dkv_kernel(Args a) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int HK = a.H / a.group;
  if (w >= int64_t(a.B) * HK * a.Lk) return;
  const int j = int(w % a.Lk), hk = int((w / a.Lk) % HK), b = int(w / (int64_t(a.Lk) * HK));
  const int lane = threadIdx.x & 31;
  float kr[kMaxPerLane], vr[kMaxPerLane], qr[kMaxPerLane], dor[kMaxPerLane], gk[kMaxPerLane] = {}, gv[kMaxPerLane] = {};
  load_row<T>(a.k.p, b * a.k.sb + j * a.k.sl + hk * a.k.sh, a.D, kr);
  load_row<T>(a.v.p, b * a.v.sb + j * a.v.sl + hk * a.v.sh, a.Dv, vr);
  for (int h = hk * a.group; h < (hk + 1) * a.group; ++h)
    for (int64_t e = a.col_off[j]; e < a.col_off[j + 1]; ++e) {
      const int i = a.rows[e];
      load_row<T>(a.q.p, b * a.q.sb + i * a.q.sl + h * a.q.sh, a.D, qr);
      load_row<T>(a.dout.p, b * a.dout.sb + i * a.dout.sl + h * a.dout.sh, a.Dv, dor);
      const int64_t li = b * a.lse_sb + h * a.lse_sh + i;
      const float p = __expf(a.scale * dot(qr, kr) - a.lse[li]);
      const float ds = p * (dot(dor, vr) - a.delta[b * a.delta_sb + h * a.delta_sh + i]) * a.scale;
#pragma unroll
      for (int t = 0; t < kMaxPerLane; ++t) gk[t] += ds * qr[t], gv[t] += p * dor[t];
    }
#pragma unroll
  for (int t = 0; t < kMaxPerLane; ++t) {
    if (lane + 32 * t < a.D) put<T>(a.dk, b * a.dk_sb + j * a.dk_sl + hk * a.dk_sh + lane + 32 * t, gk[t], a.accumulate);
    if (lane + 32 * t < a.Dv) put<T>(a.dv, b * a.dv_sb + j * a.dv_sl + hk * a.dv_sh + lane + 32 * t, gv[t], a.accumulate);
  }
}

template <class T>
void launch(const Args& a, cudaStream_t s) {
  constexpr int kThreads = 256;
  const int64_t wq = int64_t(a.B) * a.H * a.Lq, wk = int64_t(a.B) * (a.H / a.group) * a.Lk;
  if (wq > 0) dq_kernel<T><<<unsigned((wq * 32 + kThreads - 1) / kThreads), kThreads, 0, s>>>(a);
  SPATTN_LAUNCH_CHECK("backward dq_kernel");
  if (wk > 0) dkv_kernel<T><<<unsigned((wk * 32 + kThreads - 1) / kThreads), kThreads, 0, s>>>(a);
  SPATTN_LAUNCH_CHECK("backward dkv_kernel");
}

template <class V>
V* upload(const std::vector<V>& h) {
  V* d = nullptr;
  SPATTN_CUDA_CHECK(cudaMalloc(&d, std::max<size_t>(1, h.size()) * sizeof(V)));
  if (!h.empty()) SPATTN_CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(V), cudaMemcpyHostToDevice));
  return d;
}

}  // namespace

CsrBackward::CsrBackward(const BoundPattern& pattern) : q_len_(pattern.q_len()), k_len_(pattern.k_len()) {
  const Csr c = make_csr(pattern);
  upload_csr(c.row_offsets, c.col_indices);
}

CsrBackward::CsrBackward(int64_t q_len, int64_t k_len, const std::vector<int64_t>& offsets,
                         const std::vector<int32_t>& cols)
    : q_len_(q_len), k_len_(k_len) {
  if (int64_t(offsets.size()) != q_len + 1 || offsets.back() != int64_t(cols.size()))
    throw Error("gpu backward: a CSR of " + std::to_string(offsets.size()) + " offsets and " +
                std::to_string(cols.size()) + " keys for " + std::to_string(q_len) + " rows");
  upload_csr(offsets, cols);
}

void CsrBackward::upload_csr(const std::vector<int64_t>& row_offsets, const std::vector<int32_t>& col_indices) {
  // The transpose by counting: for each key, the queries that keep it, ascending.
  std::vector<int64_t> col_off(size_t(k_len_) + 1, 0);
  for (int32_t j : col_indices) col_off[size_t(j) + 1] += 1;
  for (int64_t j = 0; j < k_len_; ++j) col_off[size_t(j) + 1] += col_off[size_t(j)];
  std::vector<int32_t> rows(col_indices.size());
  std::vector<int64_t> fill(col_off.begin(), col_off.end() - 1);
  for (int64_t i = 0; i < q_len_; ++i)
    for (int64_t e = row_offsets[size_t(i)]; e < row_offsets[size_t(i) + 1]; ++e)
      rows[size_t(fill[size_t(col_indices[size_t(e)])]++)] = int32_t(i);
  // The keys by how many queries keep them, most first (stable: a counting sort on the counts).
  int64_t most = 0;
  for (int64_t j = 0; j < k_len_; ++j) most = std::max(most, col_off[size_t(j) + 1] - col_off[size_t(j)]);
  std::vector<int64_t> at(size_t(most) + 2, 0);
  for (int64_t j = 0; j < k_len_; ++j) at[size_t(most - (col_off[size_t(j) + 1] - col_off[size_t(j)])) + 1] += 1;
  for (size_t c = 1; c < at.size(); ++c) at[c] += at[c - 1];
  std::vector<int32_t> order(static_cast<size_t>(k_len_));
  for (int64_t j = 0; j < k_len_; ++j)
    order[size_t(at[size_t(most - (col_off[size_t(j) + 1] - col_off[size_t(j)]))]++)] = int32_t(j);
  try {
    row_off_ = upload(row_offsets);
    cols_ = upload(col_indices);
    col_off_ = upload(col_off);
    rows_ = upload(rows);
    key_order_ = upload(order);
  } catch (...) {
    cudaFree(row_off_), cudaFree(cols_), cudaFree(col_off_), cudaFree(rows_), cudaFree(key_order_);
    row_off_ = nullptr, cols_ = nullptr, col_off_ = nullptr, rows_ = nullptr, key_order_ = nullptr;
    throw;
  }
}

CsrBackward::~CsrBackward() {
  cudaFree(row_off_);
  cudaFree(cols_);
  cudaFree(col_off_);
  cudaFree(rows_);
  cudaFree(key_order_);
}

namespace {
// The rows kernels' arguments for these tensors (scattered_backward.hpp).
ScatteredBwdParams rows_params(const Problem& p, const TensorView* t[8], const TensorView& lse, float* delta,
                               int64_t delta_sb, int64_t delta_sh, bool accumulate) {
  ScatteredBwdParams a;
  ScatteredBwdParams::Rows* r[] = {&a.q, &a.k, &a.v, &a.o, &a.dout, &a.dq, &a.dk, &a.dv};
  for (int i = 0; i < 8; ++i) *r[i] = {t[i]->data, t[i]->stride[0], t[i]->stride[1], t[i]->stride[2]};
  a.lse = static_cast<const float*>(lse.data), a.lse_sb = lse.stride[0], a.lse_sh = lse.stride[1];
  a.delta = delta, a.delta_sb = delta_sb, a.delta_sh = delta_sh;
  a.batch = int(p.batch), a.q_heads = int(p.q_heads), a.group = int(p.q_heads / p.kv_heads);
  a.q_len = int(p.q_len), a.k_len = int(p.kv_len), a.head_dim = p.dv() == p.head_dim ? int(p.head_dim) : 0;
  a.scale = float(p.softmax_scale());
  a.accumulate = accumulate ? 1 : 0;
  a.bf16 = t[0]->dtype == DType::bf16;
  return a;
}
}  // namespace

bool CsrBackward::run(const Problem& p, const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& o, const TensorView& lse, const TensorView& dout, const TensorView& dq,
                      const TensorView& dk, const TensorView& dv, float* delta, int64_t delta_sb, int64_t delta_sh,
                      void* stream, bool accumulate, bool rows_kernels) const {
  if (p.q_len != q_len_ || p.kv_len != k_len_)
    throw Error("gpu backward: built for lengths " + std::to_string(q_len_) + " x " + std::to_string(k_len_) +
                ", problem has " + std::to_string(p.q_len) + " x " + std::to_string(p.kv_len));
  if (p.head_dim > 32 * kMaxPerLane || p.dv() > 32 * kMaxPerLane)
    throw Error("gpu backward: head dims up to " + std::to_string(32 * kMaxPerLane) + ", got " + std::to_string(p.head_dim));
  if (!o.data || !lse.data) throw Error("gpu backward: needs the forward's o and lse");
  if (lse.dtype != DType::f32 || lse.stride[2] != 1)
    throw Error("gpu backward: lse must be fp32 [B, Hq, Lq], contiguous along the queries");
  const TensorView* all[] = {&q, &k, &v, &o, &dout, &dq, &dk, &dv};
  const char* names[] = {"q", "k", "v", "o", "dout", "dq", "dk", "dv"};
  for (int t = 0; t < 8; ++t) {
    if (all[t]->dtype != q.dtype)
      throw Error(std::string("gpu backward: ") + names[t] + " has dtype " + std::string(dtype_name(all[t]->dtype)) +
                  ", q has " + std::string(dtype_name(q.dtype)));
    if (all[t]->stride[3] != 1) throw Error(std::string("gpu backward: ") + names[t] + " needs a contiguous head dim");
  }
  if (rows_kernels && q.dtype != DType::f32) {
    ScatteredBwdParams rp = rows_params(p, all, lse, delta, delta_sb, delta_sh, accumulate);
    rp.row_off = row_off_, rp.cols = cols_, rp.col_off = col_off_, rp.rows = rows_, rp.key_order = key_order_;
    if (scattered_backward_takes(rp)) {
      SPATTN_CUDA_CHECK(cudaError_t(launch_scattered_backward(rp, stream)));
      return true;
    }
  }
  auto view = [](const TensorView& t) { return View{t.data, t.stride[0], t.stride[1], t.stride[2]}; };
  Args a{view(q), view(k), view(v), view(o), view(dout), dq.data, dk.data, dv.data,
         dq.stride[0], dq.stride[1], dq.stride[2], dk.stride[0], dk.stride[1], dk.stride[2],
         dv.stride[0], dv.stride[1], dv.stride[2], static_cast<const float*>(lse.data), delta, lse.stride[0], lse.stride[1], delta_sb, delta_sh,
         int(p.batch), int(p.q_heads), int(p.q_heads / p.kv_heads), int(p.q_len), int(p.kv_len), int(p.head_dim),
         int(p.dv()), float(p.softmax_scale()), accumulate ? 1 : 0, row_off_, cols_, col_off_, rows_};
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (q.dtype) {
    case DType::f32: launch<float>(a, s); break;
    case DType::f16: launch<__half>(a, s); break;
    case DType::bf16: launch<__nv_bfloat16>(a, s); break;
    default: throw Error("gpu backward: dtype must be fp32, fp16 or bf16, got " + std::string(dtype_name(q.dtype)));
  }
  return false;
}

// A compound pattern's backward by parts (plan::backward_parts): the decision, then each part's pass built at the
// first run.
struct PartsBackward {
  plan::BackwardParts plan;
  struct Run {
    std::unique_ptr<TileBackward> tile;        // a tiles or affine part where the tile kernel runs the tensors
    std::unique_ptr<ColumnsBackward> columns;  // a columns part after another part, ditto
    std::unique_ptr<CsrBackward> csr;          // every other part, and the above where the tile kernel cannot
  };
  std::vector<Run> runs;
};

PatternsBackward::PatternsBackward(const plan::Planned& planned, Problem problem, std::string kernel,
                                   const PlanOptions* options)
    : patterns_(planned.patterns),
      analyses_(planned.analyses),
      of_head_(planned.of_head),
      problem_(problem),
      kernel_(std::move(kernel)),
      choice_(plan::backward_choice(kernel_, problem_.head_dim)),
      csr_(patterns_.size()),
      tile_(patterns_.size()),
      strips_(patterns_.size()),
      strips_why_(patterns_.size()),
      parts_(patterns_.size()),
      parts_decided_(patterns_.size(), false) {
  if (options) options_ = *options;
  for (const BoundPattern& p : patterns_) strips_grid_.push_back(plan::query_strips_grid(p));
}

bool PatternsBackward::parts_ready(size_t i) const {
  if (!options_) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (!parts_decided_[i]) {
    const DeviceInfo& info = device_info(current_device());
    plan::BackwardParts bp =
        plan::backward_parts(patterns_[i], analyses_[i], problem_.head_dim, plan::GpuTarget{info.cc, info.sms}, *options_);
    parts_decided_[i] = true;
    parts_[i] = std::make_unique<PartsBackward>();
    parts_[i]->plan = std::move(bp);
  }
  return parts_[i]->plan.by_parts();
}

void PatternsBackward::run_parts(size_t i, const Problem& p, const TensorView& q, const TensorView& k,
                                 const TensorView& v, const TensorView& o, const TensorView& lse, const TensorView& dout,
                                 const TensorView& dq, const TensorView& dk, const TensorView& dv, int64_t delta_offset,
                                 void* stream) const {
  PartsBackward& pb = *parts_[i];
  const std::string why = TileBackward::refusal(p, q, k, v, o, lse, dout, dq, dk, dv);
  const bool tiles_run = why.empty();
  {
    // Each part's pass built at its first run: the tile backward (its plan uploaded) where the tensors allow it, else
    // the CSR pass (the part's CSR and its transpose uploaded). The tile kernel writes every gradient as the first
    // part and adds them as a later one (the affine part after the tiles part); a columns part after another adds dQ
    // and its columns' dK, dV.
    std::lock_guard<std::mutex> lock(mu_);
    pb.runs.resize(pb.plan.parts.size());
    for (size_t j = 0; j < pb.plan.parts.size(); ++j) {
      const plan::BackwardPart& part = pb.plan.parts[j];
      PartsBackward::Run& r = pb.runs[j];
      const bool tiles_kind = part.kind == plan::PartKind::tiles || part.kind == plan::PartKind::affine;
      const bool tile = tiles_run && (tiles_kind || (j > 0 && part.kind == plan::PartKind::columns));
      if (tile && tiles_kind && !r.tile) {
        const plan::Analysis an = part.analysis ? *part.analysis : plan::analyze(part.pattern);
        r.tile = std::make_unique<TileBackward>(part.pattern, an, p, plan::backward_row(choice_, an, p.head_dim));
      } else if (tile && part.kind == plan::PartKind::columns && !r.columns) {
        const plan::Analysis an = plan::analyze(part.pattern);
        r.columns = std::make_unique<ColumnsBackward>(part.pattern, part.columns, p,
                                                      plan::backward_row(choice_, an, p.head_dim));
      } else if (!tile && !r.csr) {
        std::vector<int64_t> offsets;
        std::vector<int32_t> cols;
        plan::backward_part_csr(part, offsets, cols);
        r.csr = std::make_unique<CsrBackward>(p.q_len, p.kv_len, offsets, cols);
      }
    }
    const Problem& a = problem_;
    if (!delta_) SPATTN_CUDA_CHECK(cudaMalloc(&delta_, size_t(std::max<int64_t>(1, a.batch * a.q_heads * a.q_len)) * 4));
  }
  std::string names;
  int first_row = -1;
  for (size_t j = 0; j < pb.runs.size(); ++j) {
    const PartsBackward::Run& r = pb.runs[j];
    const plan::PartKind kind = pb.plan.parts[j].kind;
    int row;
    // The first part writes the gradients, the others add theirs (each differentiated against the merged LSE and
    // delta = rowsum(dO * O): the sum over the parts is the pattern's gradient).
    if (tiles_run && r.tile) {  // a tiles or affine part
      r.tile->run(q, k, v, o, lse, dout, dq, dk, dv, stream, j > 0, j > 0);
      row = r.tile->kernel_row();
    } else if (tiles_run && r.columns && kind == plan::PartKind::columns) {
      r.columns->run(q, k, v, o, lse, dout, dq, dk, dv, stream);
      row = r.columns->kernel_row();
    } else {
      const bool rows = r.csr->run(p, q, k, v, o, lse, dout, dq, dk, dv, delta_ + delta_offset,
                                   problem_.q_heads * problem_.q_len, problem_.q_len, stream, j > 0, true);
      row = plan::find_kernel(rows ? "cuda_scattered_bwd" : "cuda_csr_bwd");
    }
    if (j == 0) first_row = row;
    names += (j ? "+" : "") + std::string(plan::kKernels[row].name);
  }
  last_row_ = first_row;
  std::lock_guard<std::mutex> lock(mu_);
  last_parts_ = "parts(" + names + ")";
}

std::string PatternsBackward::last_kernel() const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!last_parts_.empty()) return last_parts_;
  }
  const int row = last_row_.load();
  if (row < 0) return "";
  return last_strips_ ? "sm90_bwd_strips(" + std::string(plan::kKernels[row].name) + ")" : plan::kKernels[row].name;
}

TileBackward* PatternsBackward::strips_ready(size_t i, const Problem& p) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!strips_[i] && strips_why_[i].empty()) {
    std::string why;
    const int row = plan::query_strips_row(p.head_dim, &why);
    if (row >= 0) {
      try {
        strips_[i] = std::make_unique<TileBackward>(patterns_[i], analyses_[i], p, row, true);
      } catch (const Error& e) {
        why = e.what();
      }
    }
    if (!strips_[i]) {
      if (choice_.query_strips) throw Error("backward kernel 'sm90_bwd_strips': " + why);
      strips_why_[i] = why;
    }
  }
  return strips_[i].get();
}

std::string PatternsBackward::explain() const {
  std::ostringstream s;
  for (size_t i = 0; i < patterns_.size(); ++i) {
    if (i) s << "\n";
    if (patterns_.size() > 1) s << "pattern " << i << " ";
    if (!options_) {
      s << "backward: the whole pattern";
      continue;
    }
    parts_ready(i);
    std::lock_guard<std::mutex> lock(mu_);
    const PartsBackward& pb = *parts_[i];
    s << pb.plan.describe();
    if (!pb.plan.by_parts() && tile_[i]) s << "\n    " << tile_[i]->explain();
    if (strips_[i]) s << "\n    " << strips_[i]->explain();
    if (!strips_why_[i].empty()) s << "\n    query strips asked, not run: " << strips_why_[i];
    for (size_t j = 0; j < pb.runs.size(); ++j) {
      const PartsBackward::Run& r = pb.runs[j];
      if (r.tile) s << "\n    " << plan::part_kind_name(pb.plan.parts[j].kind) << " part: " << r.tile->explain();
      if (r.columns) s << "\n    " << plan::part_kind_name(pb.plan.parts[j].kind) << " part: " << r.columns->explain();
    }
  }
  return s.str();
}

PatternsBackward::~PatternsBackward() { cudaFree(delta_); }

void PatternsBackward::run_one(size_t i, const Problem& p, const TensorView& q, const TensorView& k,
                               const TensorView& v, const TensorView& o, const TensorView& lse, const TensorView& dout,
                               const TensorView& dq, const TensorView& dk, const TensorView& dv, int64_t delta_offset,
                               void* stream) const {
  last_strips_ = false;
  if (parts_ready(i)) return run_parts(i, p, q, k, v, o, lse, dout, dq, dk, dv, delta_offset, stream);
  const bool want_csr = choice_.csr;
  std::string why;
  if (!want_csr) {
    why = TileBackward::refusal(p, q, k, v, o, lse, dout, dq, dk, dv);
    // Query strips where asked (2-D neighborhoods where no kernel is forced, or backward_kernel "sm90_bwd_strips":
    // plan::query_strips_asked) and they fit; else the chosen row.
    if (why.empty() && plan::query_strips_asked(choice_, strips_grid_[i]))
      if (TileBackward* t = strips_ready(i, p)) {
        t->run(q, k, v, o, lse, dout, dq, dk, dv, stream);
        last_row_ = t->kernel_row();
        last_strips_ = true;
        return;
      }
    if (why.empty()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!tile_[i])
          tile_[i] = std::make_unique<TileBackward>(patterns_[i], analyses_[i], p,
                                                    plan::backward_row(choice_, analyses_[i], p.head_dim));
      }
      tile_[i]->run(q, k, v, o, lse, dout, dq, dk, dv, stream);
      last_row_ = tile_[i]->kernel_row();
      return;
    }
    if (!kernel_.empty()) throw Error("backward kernel '" + kernel_ + "' cannot run these tensors: " + why);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!csr_[i]) csr_[i] = std::make_unique<CsrBackward>(patterns_[i]);
    // The CSR pass's delta scratch: [B, Hq, Lq] of the whole problem, contiguous (per-head runs at their offset).
    const Problem& a = problem_;
    if (!delta_) SPATTN_CUDA_CHECK(cudaMalloc(&delta_, size_t(std::max<int64_t>(1, a.batch * a.q_heads * a.q_len)) * 4));
  }
  csr_[i]->run(p, q, k, v, o, lse, dout, dq, dk, dv, delta_ + delta_offset, problem_.q_heads * problem_.q_len,
               problem_.q_len, stream);
  last_row_ = plan::find_kernel("cuda_csr_bwd");
}

void PatternsBackward::run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                           const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                           const TensorView& dv, void* stream) const {
  const Problem& p = problem_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_parts_.clear();
  }
  if (!lse.data) throw Error("gpu backward: needs the forward's lse");
  if (lse.dtype != DType::f32 || lse.stride[2] != 1)
    throw Error("gpu backward: lse must be fp32 [B, Hq, Lq], contiguous along the queries");
  if (patterns_.size() == 1) return run_one(0, p, q, k, v, o, lse, dout, dq, dk, dv, 0, stream);
  // Per-head patterns: each query head through its pattern on one-head views. dk / dv of a kv head shared by
  // query heads of different patterns would need summing: refused.
  const int64_t group = p.q_heads / p.kv_heads;
  if (group != 1)
    throw Error("gpu backward: per-head patterns with grouped-query attention are not supported yet");
  Problem one = p;
  one.q_heads = one.kv_heads = 1;
  for (int64_t h = 0; h < p.q_heads; ++h)
    run_one(size_t(of_head_[size_t(h)]), one, q.narrow(2, h), k.narrow(2, h), v.narrow(2, h), o.narrow(2, h),
            lse.narrow(1, h), dout.narrow(2, h), dq.narrow(2, h), dk.narrow(2, h), dv.narrow(2, h), h * p.q_len, stream);
}

}  // namespace spattn::cuda
