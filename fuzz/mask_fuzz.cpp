// fuzz/mask_fuzz.cpp — masks a user hands in (spattn::Csr, spattn::Bsr, BoundPattern::from_rows) from arbitrary
// bytes: validation refuses the malformed ones with a spattn::Error; a valid one converts losslessly between CSR
// and BSR and plans and runs on the CPU engine, matching attention computed in fp64 from its rows.
// Input: a mode byte (0: CSR, raw offsets and columns; 1: CSR, per-row counts; 2: BSR), the shape, then values.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "fuzz/fuzz_input.hpp"
#include "spattn/format.hpp"
#include "spattn/plan.hpp"

namespace {

using spattn::DType;
using spattn::TensorView;

// The CPU engine on the mask against attention computed here in fp64 from the mask's CSR rows (small fixed inputs).
// The reference engine, which this replaced, tests every (query, key) pair through BoundPattern::contains (a binary
// search in an explicit mask): O(rows x cols log) an input, 45% of the target's time; this is O(nnz), and the
// engine's plan is built from the mask as a user's would be (make_plan of the Csr or Bsr). Masks past kMaxEngineNnz
// (mutated BSR bitmasks reach 90000) are validated and converted but not run: the engine then took most of the time.
// 30 s from the corpus on the 2-core VM: 3370 inputs a second before, 4660 with the fp64 rows, 9860 with the cap.
constexpr int64_t kMaxEngineNnz = 16384;
template <class Mask>
void check_engine(const Mask& m, const spattn::Csr& rows) {
  if (rows.nnz() > kMaxEngineNnz) return;
  constexpr int D = 4;
  spattn::Problem pr;
  pr.q_len = m.rows, pr.kv_len = m.cols, pr.head_dim = D, pr.q_heads = pr.kv_heads = 1;
  std::vector<float> q(size_t(m.rows * D)), kv(size_t(m.cols * D)), o(q.size());
  for (size_t i = 0; i < q.size(); ++i) q[i] = float(int(i % 7) - 3) * 0.25f;
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = float(int(i % 5) - 2) * 0.5f;
  const TensorView tq = TensorView::contiguous(q.data(), DType::f32, {1, m.rows, 1, D});
  const TensorView tk = TensorView::contiguous(kv.data(), DType::f32, {1, m.cols, 1, D});
  // One thread: the process-wide worker threads are never joined, and LeakSanitizer at exit at times took the
  // row caches (thread_local) of one being started for leaks.
  spattn::PlanOptions opt;
  opt.threads = 1;
  spattn::make_plan(m, pr, spattn::Device::cpu(), opt)
      .forward(tq, tk, tk, TensorView::contiguous(o.data(), DType::f32, tq.shape), {});
  for (int64_t i = 0; i < m.rows; ++i) {
    const int64_t b = rows.row_offsets[size_t(i)], e = rows.row_offsets[size_t(i) + 1];
    double mx = -INFINITY, sum = 0, acc[D] = {};
    auto score = [&](int64_t j) {
      double s = 0;
      for (int d = 0; d < D; ++d) s += double(q[size_t(i * D + d)]) * kv[size_t(j * D + d)];
      return s / std::sqrt(double(D));
    };
    for (int64_t t = b; t < e; ++t) mx = std::max(mx, score(rows.col_indices[size_t(t)]));
    for (int64_t t = b; t < e; ++t) {
      const int64_t j = rows.col_indices[size_t(t)];
      const double p = std::exp(score(j) - mx);
      sum += p;
      for (int d = 0; d < D; ++d) acc[d] += p * kv[size_t(j * D + d)];
    }
    for (int d = 0; d < D; ++d)  // an empty row: O = 0
      if (!(std::abs(o[size_t(i * D + d)] - (sum > 0 ? acc[d] / sum : 0.0)) <= 1e-4)) std::abort();  // disagree
  }
}

// Runs f on a mask that passed validation: an Error now is a bug (validation let through what later code refuses).
template <class F>
void valid(F&& f) {
  try {
    f();
  } catch (const spattn::Error&) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  spattn::fuzz::Input in(data, size);
  const int mode = in.byte() % 3;
  try {
    if (mode < 2) {
      spattn::Csr c;
      c.rows = in.upto(70) - 2;  // a few negative shapes too
      c.cols = in.upto(70) - 2;
      if (mode == 0) {
        const int64_t n = in.upto(80);
        for (int64_t i = 0; i < n; ++i) c.row_offsets.push_back(in.u16() - 3);
        const int64_t nc = in.upto(300);
        for (int64_t i = 0; i < nc; ++i) c.col_indices.push_back(int32_t(in.u16()) - 3);
      } else if (c.rows >= 0 && c.cols >= 0) {
        c.row_offsets.push_back(0);
        for (int64_t r = 0; r < c.rows; ++r) {
          const int64_t n = in.upto(c.cols);
          int32_t k = int32_t(in.upto(3));
          for (int64_t i = 0; i < n; ++i, k += int32_t(in.upto(3))) c.col_indices.push_back(k);  // steps of 0: duplicates
          c.row_offsets.push_back(int64_t(c.col_indices.size()));
        }
      }
      // from_rows validates the same shape of data on its own.
      bool explicit_ok = true;
      try {
        spattn::BoundPattern::from_rows(c.rows, c.cols, c.row_offsets, c.col_indices);
      } catch (const spattn::Error&) {
        explicit_ok = false;
      }
      spattn::validate(c);  // throws for a malformed one
      if (!explicit_ok) std::abort();  // the two validations disagree
      valid([&] {
        const spattn::Csr back = spattn::to_csr(spattn::to_bsr(c, 16));
        if (back.row_offsets != c.row_offsets || back.col_indices != c.col_indices) std::abort();
        if (c.rows > 0) check_engine(c, c);
      });
    } else {
      spattn::Bsr b;
      const int blocks[] = {16, 32, 64, 128};
      b.block = blocks[in.byte() % 4];
      b.rows = in.upto(300) - 1;
      b.cols = in.upto(300) - 1;
      b.block_rows = (b.rows + b.block - 1) / b.block + int64_t(in.byte() % 8 == 0);  // sometimes wrong
      b.block_cols = (b.cols + b.block - 1) / b.block;
      const int64_t nr = in.upto(20);
      int64_t at = 0;
      b.row_offsets.push_back(0);
      for (int64_t r = 0; r < nr; ++r) b.row_offsets.push_back(at += in.upto(4) - int64_t(in.byte() % 16 == 0));
      for (int64_t i = 0; i < at; ++i) {
        b.col_indices.push_back(int32_t(in.upto(12)) - 1);
        b.mask_index.push_back(in.upto(6) - 1);
      }
      const int64_t words = in.upto(4) * int64_t(b.block) * b.block / 64;
      for (int64_t i = 0; i < words; ++i) b.masks.push_back(uint64_t(in.u16()) * 0x9E3779B97F4A7C15ull);
      spattn::validate(b);
      valid([&] {
        const spattn::Csr rows = spattn::to_csr(b);
        spattn::validate(rows);
        if (b.rows > 0) check_engine(b, rows);
      });
    }
  } catch (const spattn::Error&) {
  }
  return 0;
}
