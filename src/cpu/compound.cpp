// cpu/compound.cpp — cpu::CompoundPlan (compound.hpp).
#include "cpu/compound.hpp"

#include <cstring>
#include <sstream>

#include "common/parallel.hpp"
#include "plan/merge.hpp"

namespace spattn::cpu {

namespace {

// The problem a part's plan runs.
Problem part_problem(const plan::Part& p, Problem pr) {
  if (p.kind == plan::PartKind::columns) pr.kv_len = int64_t(p.columns.size());
  if (p.kind == plan::PartKind::rows) pr.q_len = p.row_end - p.row_begin;
  return pr;
}

// dst [B, C, H, D] contiguous (t's dtype) <- t[b, keys[j], h, :].
std::vector<char> gather_keys(const TensorView& t, const std::vector<int32_t>& keys, TensorView& out) {
  const int64_t B = t.shape[0], C = int64_t(keys.size()), H = t.shape[2], D = t.shape[3];
  const size_t es = dtype_size(t.dtype);
  std::vector<char> buf(size_t(B * C * H * D) * es);
  out = TensorView::contiguous(buf.data(), t.dtype, {B, C, H, D});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < C; ++j)
      for (int64_t h = 0; h < H; ++h) {
        if (t.stride[3] == 1) {
          std::memcpy(static_cast<char*>(out.data) + size_t(out.offset(b, j, h, 0)) * es,
                      static_cast<const char*>(t.data) + size_t(t.offset(b, keys[size_t(j)], h, 0)) * es, size_t(D) * es);
        } else {
          for (int64_t d = 0; d < D; ++d) out.store(b, j, h, d, t.load(b, keys[size_t(j)], h, d));
        }
      }
  return buf;
}

}  // namespace

CompoundPlan::CompoundPlan(plan::Split split, const Problem& problem, const Options& options)
    : problem_(problem), parts_(std::move(split.parts)), split_ms_(split.ms) {
  for (const plan::Part& p : parts_) plans_.emplace_back(std::vector<BoundPattern>{p.pattern}, part_problem(p, problem), options);
}

void CompoundPlan::run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                       const TensorView& lse_in, const Options& options) const {
  const Problem& pr = problem_;
  const int64_t B = pr.batch, Lq = pr.q_len, H = pr.q_heads, Dv = pr.dv();
  Problem::check_view(o, "o", {B, Lq, H, Dv});
  if (o.dtype != DType::f32) throw Error(std::string("fused CPU attention writes fp32 output; o is ") + std::string(dtype_name(o.dtype)));
  std::vector<float> lse_ws, o2, lse2;
  TensorView lse = lse_in;
  if (!lse.data) {
    lse_ws.resize(size_t(B * H * Lq));
    lse = TensorView::contiguous(lse_ws.data(), DType::f32, {B, H, Lq, 1});
  }
  const int threads = options.threads;
  for (size_t i = 0; i < parts_.size(); ++i) {
    const plan::Part& p = parts_[i];
    const FusedPlan& fp = plans_[i];
    if (p.kind == plan::PartKind::rows) {
      fp.run(q.slice(1, p.row_begin, p.row_end), k, v, o.slice(1, p.row_begin, p.row_end),
             lse.slice(2, p.row_begin, p.row_end), options);
      continue;
    }
    TensorView kk = k, vv = v;
    std::vector<char> kbuf, vbuf;
    if (p.kind == plan::PartKind::columns) {
      kbuf = gather_keys(k, p.columns, kk);
      vbuf = gather_keys(v, p.columns, vv);
    }
    if (i == 0) {
      fp.run(q, kk, vv, o, lse, options);
      continue;
    }
    // A later part: its own result, merged into o and lse row by row.
    o2.resize(size_t(B * Lq * H * Dv));
    lse2.resize(size_t(B * H * Lq));
    const TensorView ov = TensorView::contiguous(o2.data(), DType::f32, {B, Lq, H, Dv});
    const TensorView lv = TensorView::contiguous(lse2.data(), DType::f32, {B, H, Lq, 1});
    fp.run(q, kk, vv, ov, lv, options);
    common::parallel_for(B * Lq, threads > 0 ? threads : common::hardware_threads(), [&](int64_t bq, int) {
      const int64_t b = bq / Lq, qi = bq % Lq;
      for (int64_t h = 0; h < H; ++h) {
        float& l = static_cast<float*>(lse.data)[lse.offset(b, h, qi, 0)];
        const plan::MergeWeights w = plan::merge_weights(l, lse2[size_t(lv.offset(b, h, qi, 0))]);
        if (w.wb == 0.f) continue;
        float* orow = static_cast<float*>(o.data) + o.offset(b, qi, h, 0);
        const float* prow = o2.data() + ov.offset(b, qi, h, 0);
        for (int64_t d = 0; d < Dv; ++d) orow[d * o.stride[3]] = w.wa * orow[d * o.stride[3]] + w.wb * prow[d];
        l = w.lse;
      }
    });
  }
}

std::string CompoundPlan::describe() const {
  std::ostringstream s;
  s << "compound plan, " << parts_.size() << " parts merged through their LSE (split " << split_ms_ << " ms)";
  for (size_t i = 0; i < parts_.size(); ++i) s << "\n  " << plan::describe(parts_[i]) << "; " << plans_[i].describe();
  return s.str();
}

}  // namespace spattn::cpu
