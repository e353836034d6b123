// cuda/fused/compound.cpp — CompoundAttention (compound.hpp).
#include "cuda/fused/compound.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <sstream>
#include <vector>

#include "cuda/common/buffer.hpp"
#include "cuda/fused/parts_kernels.hpp"
#include "cuda/fused/random_rows.hpp"
#include "plan/kernels.hpp"

namespace spattn::cuda::fused {

namespace {

RowTensor rows_of(const TensorView& t) { return {t.data, t.stride[0], t.stride[1], t.stride[2]}; }

void check_rows(const TensorView& t, const char* name) {
  if (t.stride[3] != 1 || reinterpret_cast<uintptr_t>(t.data) % 16 || t.stride[0] % 8 || t.stride[1] % 8 ||
      t.stride[2] % 8)
    throw Error(std::string("compound plan: ") + name +
                " must have a contiguous head dim and be 16-byte aligned, pointer and strides (its parts gather and "
                "merge whole rows)");
}

void launched(int err, const char* what) {
  if (err) check(cudaError_t(err), what, __FILE__, __LINE__);
}

}  // namespace

struct CompoundAttention::Impl {
  struct PartRun {
    plan::Part part;
    std::optional<FusedAttention> attn;  // tiles, columns, rows
    DeviceBuffer keys, offsets, cols;    // columns: keys; scattered: the CSR
  };
  Problem problem;
  std::vector<PartRun> parts;
  DeviceBuffer lse_ws;        // [B, Hq, Lq] where the caller passes no lse
  DeviceBuffer kc, vc;        // columns: gathered K/V [B, C, Hkv, D]
  DeviceBuffer o2, lse2;      // columns after another part: its result, merged in
  PlanTimes times;
  mutable std::atomic<int> last_row{-1};

  int row_of(const PartRun& p) const {
    return p.attn ? p.attn->kernel_row() : plan::find_kernel("cuda_scattered");
  }
};

CompoundAttention::CompoundAttention(plan::PatternDecision decision, const Problem& problem)
    : impl_(std::make_unique<Impl>()) {
  const auto t0 = std::chrono::steady_clock::now();
  Impl& m = *impl_;
  m.problem = problem;
  plan::Split& split = decision.split;
  const double split_ms = split.ms;
  const size_t es = dtype_size(problem.dtype);
  const int64_t rows = problem.batch * problem.q_heads * problem.q_len;
  m.lse_ws = DeviceBuffer(size_t(rows) * sizeof(float));
  for (size_t i = 0; i < split.parts.size(); ++i) {
    Impl::PartRun r;
    r.part = std::move(split.parts[i]);
    const plan::Part& p = r.part;
    if (decision.launches[i]) r.attn.emplace(std::move(*decision.launches[i]));  // tiles, rows, columns
    switch (p.kind) {
      case plan::PartKind::tiles:
      case plan::PartKind::rows:
        break;
      case plan::PartKind::affine:  // after the tiles part: its result merged in
        if (i > 0 && !m.o2.get()) {
          m.o2 = DeviceBuffer(size_t(rows) * size_t(problem.dv()) * es);
          m.lse2 = DeviceBuffer(size_t(rows) * sizeof(float));
        }
        break;
      case plan::PartKind::columns: {
        r.keys = DeviceBuffer::upload(p.columns);
        const size_t kv = size_t(problem.batch) * p.columns.size() * size_t(problem.kv_heads) * size_t(problem.head_dim) * es;
        m.kc = DeviceBuffer(kv);
        m.vc = DeviceBuffer(kv);
        if (i > 0) {
          m.o2 = DeviceBuffer(size_t(rows) * size_t(problem.dv()) * es);
          m.lse2 = DeviceBuffer(size_t(rows) * sizeof(float));
        }
        break;
      }
      case plan::PartKind::scattered:
        if (p.drawn.r > 0) {  // drawn here (plan::Part::drawn), waited for as the uploads are
          const int64_t lq = problem.q_len, lk = problem.kv_len;
          const bool band = p.drawn_lo <= p.drawn_hi;
          r.offsets = DeviceBuffer(size_t(lq + 1) * sizeof(int64_t));
          DeviceBuffer counts(band ? size_t(std::max<int64_t>(lq, 1)) * sizeof(int32_t) : 0);  // kept to the wait below
          if (band) {  // rows less the band: their counts first, the offsets from them on the device
            launched(launch_random_counts(p.drawn.r, p.drawn.seed, lq, lk, p.drawn_lo, p.drawn_hi, counts.get<int32_t>(),
                                          nullptr),
                     "random_counts");
            launched(launch_random_offsets(counts.get<int32_t>(), lq, r.offsets.get<int64_t>(), nullptr), "random_offsets");
          }
          r.cols = DeviceBuffer(size_t(checked_bytes("a scattered part's keys", {std::max<int64_t>(p.nnz, 1)}, 4)));
          launched(launch_random_csr(p.drawn.r, p.drawn.seed, lq, lk, p.drawn_lo, p.drawn_hi, band, r.offsets.get<int64_t>(),
                                     r.cols.get<int32_t>(), p.nnz, nullptr),
                   "random_csr");
          check(cudaStreamSynchronize(nullptr), "random_csr", __FILE__, __LINE__);
          if (band) {  // the keys drawn are the plan's (checked after the fill: one wait, not one before it too)
            int64_t drawn = 0;
            check(cudaMemcpy(&drawn, r.offsets.get<int64_t>() + lq, sizeof drawn, cudaMemcpyDeviceToHost), "random_offsets",
                  __FILE__, __LINE__);
            if (drawn != p.nnz)
              throw Error("compound plan: the scattered part drew " + std::to_string(drawn) + " keys, its plan says " +
                          std::to_string(p.nnz));
          }
          break;
        }
        r.offsets = DeviceBuffer::upload(p.offsets);
        r.cols = DeviceBuffer::upload(p.cols);
        r.part.offsets.clear();  // on the device now (the explicit pattern keeps its own copy)
        r.part.cols.clear();
        break;
    }
    m.parts.push_back(std::move(r));
  }
  // The parts' plans by stage (made by the planner before); what else this took (the scratch, the keys and CSR
  // uploads) counts as uploads.
  double part_uploads = 0;
  for (const Impl::PartRun& r : m.parts)
    if (r.attn) m.times += r.attn->plan_times(), part_uploads += r.attn->plan_times().upload;
  m.times.upload += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() - part_uploads;
  m.times.split = split_ms;
}
CompoundAttention::~CompoundAttention() = default;
CompoundAttention::CompoundAttention(CompoundAttention&&) noexcept = default;
CompoundAttention& CompoundAttention::operator=(CompoundAttention&&) noexcept = default;

namespace {

// A part after the first: its result into the scratch (o2, lse2), merged into o and lse through the LSE.
void merge_run(const DeviceBuffer& o2buf, const DeviceBuffer& lse2buf, const FusedAttention& attn, const Problem& sub, const TensorView& q,
               const TensorView& k, const TensorView& v, const TensorView& o, const TensorView& lse, bool bf16,
               void* stream) {
  const TensorView o2 = TensorView::contiguous(o2buf.get(), sub.dtype, {sub.batch, sub.q_len, sub.q_heads, sub.dv()});
  const TensorView l2 = TensorView::contiguous(lse2buf.get(), DType::f32, {sub.batch, sub.q_heads, sub.q_len, 1});
  attn.run(sub, q, k, v, o2, l2, stream);
  launched(launch_merge(rows_of(o), static_cast<float*>(lse.data), lse.stride[0], lse.stride[1], o2buf.get(),
                        lse2buf.get<float>(), int(sub.batch), int(sub.q_len), int(sub.q_heads), int(sub.dv()), bf16, stream),
           "merge");
}

}  // namespace

void CompoundAttention::run(const Problem& pr, const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& o, const TensorView& lse_in, void* stream) const {
  const Impl& m = *impl_;
  check_rows(q, "q");
  check_rows(k, "k");
  check_rows(v, "v");
  check_rows(o, "o");
  if (pr.dtype != DType::bf16 && pr.dtype != DType::f16)
    throw Error("compound plan: dtype must be bf16 or fp16, got " + std::string(dtype_name(pr.dtype)));
  const bool bf16 = pr.dtype == DType::bf16;
  TensorView lse = lse_in;
  if (!lse.data) {
    lse = TensorView::contiguous(m.lse_ws.get(), DType::f32, {pr.batch, pr.q_heads, pr.q_len, 1});
  } else if (lse.stride[2] != 1) {
    throw Error("compound plan: lse must be contiguous along the query axis");
  }
  bool first = true;
  for (const Impl::PartRun& r : m.parts) {
    const plan::Part& p = r.part;
    switch (p.kind) {
      case plan::PartKind::tiles:
        r.attn->run(pr, q, k, v, o, lse, stream);
        break;
      case plan::PartKind::affine: {  // over (Lq, Lk), its rows gathered by residue (the part's plan, perm_d)
        if (first) {
          r.attn->run(pr, q, k, v, o, lse, stream);
          break;
        }
        // Merged in the kernel's epilogue (issue 42: no scratch copy written and read back, no merge launch; two of
        // the split's four extra passes over O); by the merge kernel where the part's kernel cannot merge.
        if (r.attn->merges_out()) {
          r.attn->run(pr, q, k, v, o, lse, stream, true);
          break;
        }
        merge_run(m.o2, m.lse2, *r.attn, pr, q, k, v, o, lse, bf16, stream);
        break;
      }
      case plan::PartKind::rows: {
        Problem sub = pr;
        sub.q_len = p.row_end - p.row_begin;
        r.attn->run(sub, q.slice(1, p.row_begin, p.row_end), k, v, o.slice(1, p.row_begin, p.row_end),
                    lse.slice(2, p.row_begin, p.row_end), stream);
        break;
      }
      case plan::PartKind::columns: {
        const int nk = int(p.columns.size());
        launched(launch_gather_keys(rows_of(k), m.kc.get(), r.keys.get<int32_t>(), int(pr.batch), nk, int(pr.kv_heads),
                                    int(pr.head_dim), stream), "gather_keys (k)");
        launched(launch_gather_keys(rows_of(v), m.vc.get(), r.keys.get<int32_t>(), int(pr.batch), nk, int(pr.kv_heads),
                                    int(pr.dv()), stream), "gather_keys (v)");
        Problem sub = pr;
        sub.kv_len = nk;
        const TensorView kc = TensorView::contiguous(m.kc.get(), pr.dtype, {pr.batch, nk, pr.kv_heads, pr.head_dim});
        const TensorView vc = TensorView::contiguous(m.vc.get(), pr.dtype, {pr.batch, nk, pr.kv_heads, pr.dv()});
        if (first) {
          r.attn->run(sub, q, kc, vc, o, lse, stream);
          break;
        }
        merge_run(m.o2, m.lse2, *r.attn, sub, q, kc, vc, o, lse, bf16, stream);
        break;
      }
      case plan::PartKind::scattered: {
        ScatteredParams sp;
        sp.q = rows_of(q), sp.k = rows_of(k), sp.v = rows_of(v), sp.o = rows_of(o);
        sp.lse = static_cast<float*>(lse.data);
        sp.lse_sb = lse.stride[0], sp.lse_sh = lse.stride[1];
        sp.offsets = r.offsets.get<int64_t>();
        sp.cols = r.cols.get<int32_t>();
        sp.batch = int(pr.batch), sp.q_heads = int(pr.q_heads), sp.group = int(pr.q_heads / pr.kv_heads);
        sp.q_len = int(pr.q_len), sp.head_dim = int(pr.head_dim);
        sp.scale_log2 = float(pr.softmax_scale() * 1.4426950408889634);
        sp.merge = first ? 0 : 1;
        sp.bf16 = bf16;
        launched(launch_scattered(sp, stream), "scattered attention");
        break;
      }
    }
    if (&r == &m.parts.front())
      m.last_row.store(r.attn ? r.attn->last_kernel_row() : m.row_of(r), std::memory_order_relaxed);
    first = false;
  }
}

std::string CompoundAttention::explain() const {
  const Impl& m = *impl_;
  std::ostringstream s;
  s << "compound plan, " << m.parts.size() << " parts merged through their LSE (split " << m.times.split << " ms, plan "
    << m.times.total() << " ms)";
  for (const Impl::PartRun& r : m.parts) {
    s << "\n  " << plan::describe(r.part) << "; " << (r.attn ? r.attn->explain() : std::string("kernel cuda_scattered: a warp a row, K/V rows gathered"));
    // How a later affine part's rows join the others (run).
    if (&r != &m.parts.front() && r.part.kind == plan::PartKind::affine)
      s << (r.attn->merges_out() ? "; merged into the rows before it in its kernel's epilogue"
                                 : "; its rows written to scratch, merged by the merge kernel");
  }
  return s.str();
}
int CompoundAttention::kernel_row() const { return impl_->row_of(impl_->parts.front()); }
int CompoundAttention::last_kernel_row() const { return impl_->last_row.load(std::memory_order_relaxed); }
const PlanTimes& CompoundAttention::plan_times() const { return impl_->times; }

}  // namespace spattn::cuda::fused
