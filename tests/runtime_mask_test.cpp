// Run-time masks (spattn/runtime_mask.hpp) on the CPU: block masks, packed documents and top-k keys, fresh random
// contents every call, against a dense fp64 attention over the pairs this file derives from the semantics' words
// (its own loops), on both CPU engines (cpu_fused: rows enumerated; reference: the predicate), forward and backward;
// and the checking mode's errors, each naming the value.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "spattn/runtime_mask.hpp"

namespace {

using spattn::DType;
using spattn::TensorView;

spattn::Problem problem(int64_t B, int64_t H, int64_t HK, int64_t Lq, int64_t Lk, int64_t D) {
  spattn::Problem p;
  p.batch = B, p.q_heads = H, p.kv_heads = HK, p.q_len = Lq, p.kv_len = Lk, p.head_dim = D, p.dtype = DType::f32;
  return p;
}

using Kept = std::function<bool(int64_t b, int64_t h, int64_t q, int64_t k)>;

struct Case {
  spattn::Problem p;
  std::vector<float> q, k, v, dout;
  explicit Case(const spattn::Problem& pr, uint32_t seed) : p(pr) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    q.resize(size_t(p.batch * p.q_len * p.q_heads * p.head_dim));
    k.resize(size_t(p.batch * p.kv_len * p.kv_heads * p.head_dim));
    v.resize(k.size());
    dout.resize(q.size());
    for (auto* t : {&q, &k, &v, &dout})
      for (float& x : *t) x = nd(rng);
  }
  TensorView tq() { return TensorView::contiguous(q.data(), DType::f32, {p.batch, p.q_len, p.q_heads, p.head_dim}); }
  TensorView tk() { return TensorView::contiguous(k.data(), DType::f32, {p.batch, p.kv_len, p.kv_heads, p.head_dim}); }
  TensorView tv() { return TensorView::contiguous(v.data(), DType::f32, {p.batch, p.kv_len, p.kv_heads, p.head_dim}); }
  TensorView tdout() { return TensorView::contiguous(dout.data(), DType::f32, {p.batch, p.q_len, p.q_heads, p.head_dim}); }

  // Dense fp64 attention over `kept`: O and LSE (the file's own, from the definition of attention).
  void expected(const Kept& kept, std::vector<double>& o, std::vector<double>& lse) const {
    const int64_t B = p.batch, H = p.q_heads, Lq = p.q_len, Lk = p.kv_len, D = p.head_dim, G = H / p.kv_heads;
    o.assign(q.size(), 0.0);
    lse.assign(size_t(B * H * Lq), -std::numeric_limits<double>::infinity());
    const double scale = 1.0 / std::sqrt(double(D));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < Lq; ++i) {
          std::vector<std::pair<int64_t, double>> s;
          for (int64_t j = 0; j < Lk; ++j) {
            if (!kept(b, h, i, j)) continue;
            double dot = 0;
            for (int64_t d = 0; d < D; ++d)
              dot += double(q[size_t(((b * Lq + i) * H + h) * D + d)]) * k[size_t(((b * Lk + j) * p.kv_heads + h / G) * D + d)];
            s.push_back({j, dot * scale});
          }
          if (s.empty()) continue;
          double m = -std::numeric_limits<double>::infinity(), sum = 0;
          for (auto& x : s) m = std::max(m, x.second);
          for (auto& x : s) sum += std::exp(x.second - m);
          for (auto& [j, sc] : s)
            for (int64_t d = 0; d < D; ++d)
              o[size_t(((b * Lq + i) * H + h) * D + d)] +=
                  std::exp(sc - m) / sum * v[size_t(((b * Lk + j) * p.kv_heads + h / G) * D + d)];
          lse[size_t((b * H + h) * Lq + i)] = m + std::log(sum);
        }
  }
};

double max_err(const std::vector<float>& a, const std::vector<double>& b) {
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(b[i]) && a[i] == float(b[i])) continue;
    e = std::max(e, std::abs(double(a[i]) - b[i]));
  }
  return e;
}

spattn::Plan runtime_plan(const spattn::MaskLayout& layout, const spattn::Problem& p, spattn::Engine e) {
  spattn::PlanOptions o;
  o.engine = e;
  return spattn::make_plan(layout, p, spattn::Device::cpu(), o);
}

// Forward on both engines against `kept`, and the cpu_fused backward against the reference engine's.
void check_engines(Case& c, const spattn::MaskLayout& layout, const spattn::RuntimeMask& mask, const Kept& kept) {
  std::vector<double> eo, else_;
  c.expected(kept, eo, else_);
  std::vector<std::vector<float>> grads;
  for (spattn::Engine e : {spattn::Engine::cpu_fused, spattn::Engine::reference}) {
    SCOPED_TRACE(std::string(spattn::engine_name(e)));
    const spattn::Plan plan = runtime_plan(layout, c.p, e);
    EXPECT_TRUE(plan.takes_mask());
    std::vector<float> o(c.q.size()), lse(else_.size());
    const TensorView to = TensorView::contiguous(o.data(), DType::f32, c.tq().shape);
    const TensorView tl = TensorView::contiguous(lse.data(), DType::f32, {c.p.batch, c.p.q_heads, c.p.q_len, 1});
    plan.forward(c.tq(), c.tk(), c.tv(), to, tl, mask);
    EXPECT_LT(max_err(o, eo), 2e-5);
    EXPECT_LT(max_err(lse, else_), 2e-5);
    EXPECT_NE(plan.last_kernel().find("runtime_rows"), std::string::npos) << plan.last_kernel();
    std::vector<float> dq(c.q.size()), dk(c.k.size()), dv(c.v.size());
    plan.backward(c.tq(), c.tk(), c.tv(), to, tl, c.tdout(), TensorView::contiguous(dq.data(), DType::f32, c.tq().shape),
                  TensorView::contiguous(dk.data(), DType::f32, c.tk().shape),
                  TensorView::contiguous(dv.data(), DType::f32, c.tv().shape), mask);
    for (auto* g : {&dq, &dk, &dv}) grads.push_back(*g);
  }
  for (size_t i = 0; i < 3; ++i) {
    double e = 0, n = 0;
    for (size_t j = 0; j < grads[i].size(); ++j)
      e = std::max(e, double(std::abs(grads[i][j] - grads[i + 3][j]))), n = std::max(n, double(std::abs(grads[i + 3][j])));
    EXPECT_LT(e, 1e-4 * std::max(1.0, n)) << "gradient " << i;
  }
}

// A random FlexAttention-style block mask: per (b, h, query block) a random set of key blocks, some full, padded
// with junk past the counts (never read).
struct BlockMask {
  int64_t nb, nh, nq, nkb, cap;
  std::vector<int32_t> num, idx, fnum, fidx;
  BlockMask(int64_t nb_, int64_t nh_, int64_t nq_, int64_t nkb_, std::mt19937& rng)
      : nb(nb_), nh(nh_), nq(nq_), nkb(nkb_), cap(nkb_ + 1) {
    num.assign(size_t(nb * nh * nq), 0), fnum = num;
    idx.assign(size_t(nb * nh * nq * cap), 12345), fidx = idx;
    for (int64_t r = 0; r < nb * nh * nq; ++r) {
      std::vector<int32_t> blocks(static_cast<size_t>(nkb));
      std::iota(blocks.begin(), blocks.end(), 0);
      std::shuffle(blocks.begin(), blocks.end(), rng);
      const int64_t n = std::uniform_int_distribution<int64_t>(0, nkb)(rng), f = std::uniform_int_distribution<int64_t>(0, n)(rng);
      for (int64_t j = 0; j < f; ++j) fidx[size_t(r * cap + j)] = blocks[size_t(j)];
      for (int64_t j = f; j < n; ++j) idx[size_t(r * cap + j - f)] = blocks[size_t(j)];
      fnum[size_t(r)] = int32_t(f), num[size_t(r)] = int32_t(n - f);
    }
  }
  spattn::RuntimeMask mask(bool full) const {
    spattn::RuntimeMask m;
    m.kv_num_blocks = spattn::IndexView::of(num.data(), {nb, nh, nq});
    m.kv_indices = spattn::IndexView::of(idx.data(), {nb, nh, nq, cap});
    if (full) {
      m.full_kv_num_blocks = spattn::IndexView::of(fnum.data(), {nb, nh, nq});
      m.full_kv_indices = spattn::IndexView::of(fidx.data(), {nb, nh, nq, cap});
    }
    return m;
  }
  bool listed(const std::vector<int32_t>& n, const std::vector<int32_t>& ix, int64_t b, int64_t h, int64_t qb, int64_t kb) const {
    const int64_t r = ((nb == 1 ? 0 : b) * nh + (nh == 1 ? 0 : h)) * nq + qb;
    for (int64_t j = 0; j < n[size_t(r)]; ++j)
      if (ix[size_t(r * cap + j)] == kb) return true;
    return false;
  }
};

TEST(RuntimeMask, BlocksMatchTheirDefinition) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 3; ++trial) {
    const auto p = problem(2, 4, 2, 200 + 37 * trial, 171 + 29 * trial, 16);  // awkward lengths, GQA
    const int64_t QB = 64, KB = 32, nq = (p.q_len + QB - 1) / QB + trial, nkb = (p.kv_len + KB - 1) / KB;
    const BlockMask bm(trial == 1 ? 1 : 2, trial == 2 ? 1 : 4, nq, nkb, rng);  // broadcast batch / heads
    Case c(p, 100 + trial);
    for (bool full : {false, true})
      for (const char* spec : {"", "causal", "local(20) | global_cols(0:3)"}) {
        SCOPED_TRACE(std::string("trial ") + std::to_string(trial) + ", full " + std::to_string(full) + ", spec '" + spec + "'");
        const auto spec_pat = spattn::parse(*spec ? spec : "dense").bind(p.q_len, p.kv_len);
        const Kept kept = [&](int64_t b, int64_t h, int64_t q, int64_t k) {
          if (full && bm.listed(bm.fnum, bm.fidx, b, h, q / QB, k / KB)) return true;
          return bm.listed(bm.num, bm.idx, b, h, q / QB, k / KB) && spec_pat.contains(q, k);
        };
        check_engines(c, spattn::MaskLayout::blocks(QB, KB, spec), bm.mask(full), kept);
      }
  }
}

TEST(RuntimeMask, DocumentsMatchTheirDefinition) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 4; ++trial) {
    const bool cross = trial >= 2;  // queries and keys of different lengths per document
    const auto p = problem(2, 2, 1, 150 + trial * 17, cross ? 190 : 150 + trial * 17, 16);
    // Random boundaries: empty documents, a gap before the first and after the last where trial is odd.
    auto cut = [&](int64_t L, int n) {
      std::vector<int32_t> cu(static_cast<size_t>(n + 1));
      for (int i = 0; i <= n; ++i) cu[size_t(i)] = int32_t(std::uniform_int_distribution<int64_t>(0, L)(rng));
      std::sort(cu.begin(), cu.end());
      if (trial % 2 == 0) cu.front() = 0, cu.back() = int32_t(L);
      return cu;
    };
    const int n = 5 + trial;
    const std::vector<int32_t> cq = cut(p.q_len, n), ck = cross ? cut(p.kv_len, n) : cq;
    Case c(p, 200 + trial);
    for (const char* spec : {"", "causal", "local(left=7, right=0)", "local(left=5, right=0) | global_cols(0:2)"}) {
      SCOPED_TRACE(std::string("trial ") + std::to_string(trial) + ", spec '" + spec + "'");
      spattn::RuntimeMask m;
      m.cu_seqlens_q = spattn::IndexView::of(cq.data(), {n + 1});
      if (cross) m.cu_seqlens_k = spattn::IndexView::of(ck.data(), {n + 1});
      const std::string s = spec;
      const Kept kept = [&](int64_t, int64_t, int64_t q, int64_t k) {
        for (int i = 0; i < n; ++i) {
          if (q < cq[size_t(i)] || q >= cq[size_t(i + 1)]) continue;
          if (k < ck[size_t(i)] || k >= ck[size_t(i + 1)]) return false;
          const int64_t a = q - cq[size_t(i)], t = k - ck[size_t(i)];
          if (s.empty()) return true;
          if (s == "causal") return t <= a;
          if (s == "local(left=7, right=0)") return t <= a && t >= a - 7;
          return (t <= a && t >= a - 5) || t < 2;
        }
        return false;
      };
      if (s.find("global_cols(0:2)") != std::string::npos) {
        // A document shorter than the sinks cannot bind the spec: the error names the document.
        bool short_doc = false;
        for (int i = 0; i < n; ++i)
          short_doc |= ck[size_t(i + 1)] - ck[size_t(i)] > 0 && ck[size_t(i + 1)] - ck[size_t(i)] < 2 && cq[size_t(i + 1)] > cq[size_t(i)];
        if (short_doc) {
          const spattn::Plan plan = runtime_plan(spattn::MaskLayout::documents(s), p, spattn::Engine::cpu_fused);
          std::vector<float> o(c.q.size());
          EXPECT_THROW(plan.forward(c.tq(), c.tk(), c.tv(), TensorView::contiguous(o.data(), DType::f32, c.tq().shape),
                                    TensorView{}, m),
                       spattn::Error);
          continue;
        }
      }
      check_engines(c, spattn::MaskLayout::documents(s), m, kept);
    }
  }
}

TEST(RuntimeMask, TopkMatchesItsDefinition) {
  std::mt19937 rng(13);
  for (int heads_dim : {0, 1, 2, 4}) {  // [B, Lq, K]; [B, Lq, 1 / Hkv / Hq, K]
    const auto p = problem(2, 4, 2, 90, 130, 16);
    const int64_t K = 9, th = heads_dim == 0 ? 1 : heads_dim;
    std::vector<int32_t> idx(size_t(p.batch * p.q_len * th * K));
    for (size_t r = 0; r < idx.size() / K; ++r) {
      std::vector<int32_t> keys(static_cast<size_t>(p.kv_len));
      std::iota(keys.begin(), keys.end(), 0);
      std::shuffle(keys.begin(), keys.end(), rng);
      const int64_t pad = std::uniform_int_distribution<int64_t>(0, K)(rng);  // -1 entries, anywhere
      for (int64_t j = 0; j < K; ++j) idx[r * K + size_t(j)] = j < pad ? -1 : keys[size_t(j)];
      std::shuffle(idx.begin() + std::ptrdiff_t(r * K), idx.begin() + std::ptrdiff_t((r + 1) * K), rng);
    }
    Case c(p, 300 + heads_dim);
    for (const char* spec : {"", "local(left=4, right=0)"}) {
      SCOPED_TRACE(std::string("heads ") + std::to_string(heads_dim) + ", spec '" + spec + "'");
      spattn::RuntimeMask m;
      m.topk_indices = heads_dim == 0 ? spattn::IndexView::of(idx.data(), {p.batch, p.q_len, K})
                                      : spattn::IndexView::of(idx.data(), {p.batch, p.q_len, th, K});
      const bool window = *spec != 0;
      const Kept kept = [&](int64_t b, int64_t h, int64_t q, int64_t k) {
        if (window && k <= q && k >= q - 4) return true;
        const int64_t hh = th == 1 ? 0 : th == p.q_heads ? h : h / (p.q_heads / p.kv_heads);
        for (int64_t j = 0; j < K; ++j)
          if (idx[size_t(((b * p.q_len + q) * th + hh) * K + j)] == k) return true;
        return false;
      };
      check_engines(c, spattn::MaskLayout::topk_keys(K, spec), m, kept);
    }
  }
}

TEST(RuntimeMask, EmptyRowsGiveZeroAndMinusInfinity) {
  const auto p = problem(1, 1, 1, 64, 64, 8);
  Case c(p, 5);
  const std::vector<int32_t> cu{10, 20};  // rows outside [10, 20) keep nothing
  spattn::RuntimeMask m;
  m.cu_seqlens_q = spattn::IndexView::of(cu.data(), {2});
  const spattn::Plan plan = runtime_plan(spattn::MaskLayout::documents("causal"), p, spattn::Engine::cpu_fused);
  std::vector<float> o(c.q.size(), 7.f), lse(64, 7.f);
  plan.forward(c.tq(), c.tk(), c.tv(), TensorView::contiguous(o.data(), DType::f32, c.tq().shape),
               TensorView::contiguous(lse.data(), DType::f32, {1, 1, 64, 1}), m);
  for (int64_t q : {0, 9, 20, 63}) {
    EXPECT_EQ(lse[size_t(q)], -std::numeric_limits<float>::infinity()) << q;
    for (int d = 0; d < 8; ++d) EXPECT_EQ(o[size_t(q * 8 + d)], 0.f) << q;
  }
  EXPECT_TRUE(std::isfinite(lse[10]));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const spattn::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(RuntimeMask, BadMasksNameTheValue) {
  const auto p = problem(1, 2, 2, 100, 100, 8);
  Case c(p, 9);
  std::vector<float> o(c.q.size());
  const TensorView to = TensorView::contiguous(o.data(), DType::f32, c.tq().shape);
  const spattn::Plan blocks = runtime_plan(spattn::MaskLayout::blocks(32, 32, "causal"), p, spattn::Engine::cpu_fused);
  auto fwd = [&](const spattn::Plan& plan, spattn::RuntimeMask m) {
    m.check = true;
    return error_of([&] { plan.forward(c.tq(), c.tk(), c.tv(), to, TensorView{}, m); });
  };
  std::vector<int32_t> num{2, 1, 1, 1, 1, 1, 1, 1}, idx(8 * 4, 0);
  idx[1] = 3;
  spattn::RuntimeMask bm;
  bm.kv_num_blocks = spattn::IndexView::of(num.data(), {1, 2, 4});
  bm.kv_indices = spattn::IndexView::of(idx.data(), {1, 2, 4, 4});
  EXPECT_EQ(fwd(blocks, bm), "(no error)");
  idx[1] = 4;
  EXPECT_NE(fwd(blocks, bm).find("kv_indices[0, 0, 0, 1] is 4, outside [0, 4)"), std::string::npos) << fwd(blocks, bm);
  idx[1] = 0;
  EXPECT_NE(fwd(blocks, bm).find("lists key block 0 twice"), std::string::npos) << fwd(blocks, bm);
  idx[1] = 3, num[3] = 5;
  EXPECT_NE(fwd(blocks, bm).find("kv_num_blocks[0, 0, 3] is 5"), std::string::npos) << fwd(blocks, bm);
  num[3] = 1;
  std::vector<int32_t> fnum(8, 1), fidx(8 * 4, 2);
  bm.full_kv_num_blocks = spattn::IndexView::of(fnum.data(), {1, 2, 4});
  EXPECT_NE(fwd(blocks, bm).find("come together"), std::string::npos);
  bm.full_kv_indices = spattn::IndexView::of(fidx.data(), {1, 2, 4, 4});
  EXPECT_EQ(fwd(blocks, bm), "(no error)");
  fidx[0] = 3;  // row (0, 0, 0) lists block 3 as partial too
  EXPECT_NE(fwd(blocks, bm).find("full_kv_indices[0, 0, 0, 0] lists key block 3 that the row also lists"), std::string::npos)
      << fwd(blocks, bm);
  bm.full_kv_num_blocks = bm.full_kv_indices = {};
  bm.kv_num_blocks = spattn::IndexView::of(num.data(), {1, 2, 3});
  EXPECT_NE(fwd(blocks, bm).find("kv_num_blocks has 3 query blocks (dimension 2), expected at least 4"), std::string::npos)
      << fwd(blocks, bm);
  bm.kv_num_blocks = spattn::IndexView::of(num.data(), {1, 3, 2});
  EXPECT_NE(fwd(blocks, bm).find("expected 2 or 1"), std::string::npos) << fwd(blocks, bm);
  bm.kv_num_blocks = spattn::IndexView::of(num.data(), {1, 2, 4});
  std::vector<int32_t> cu{0, 50, 40, 100};
  spattn::RuntimeMask other = bm;
  other.cu_seqlens_q = spattn::IndexView::of(cu.data(), {4});
  EXPECT_NE(fwd(blocks, other).find("cu_seqlens_q was given to a plan for mask blocks:32x32:causal"), std::string::npos);

  const spattn::Plan docs = runtime_plan(spattn::MaskLayout::documents(), p, spattn::Engine::cpu_fused);
  spattn::RuntimeMask dm;
  dm.cu_seqlens_q = spattn::IndexView::of(cu.data(), {4});
  EXPECT_NE(fwd(docs, dm).find("cu_seqlens_q is not non-decreasing: [1] is 50, [2] is 40"), std::string::npos) << fwd(docs, dm);
  cu = {0, 50, 101};
  dm.cu_seqlens_q = spattn::IndexView::of(cu.data(), {3});
  EXPECT_NE(fwd(docs, dm).find("cu_seqlens_q[2] is 101, outside [0, 100]"), std::string::npos) << fwd(docs, dm);
  EXPECT_NE(fwd(docs, bm).find("kv_num_blocks was given to a plan for mask documents"), std::string::npos) << fwd(docs, bm);
  EXPECT_NE(fwd(docs, spattn::RuntimeMask{}).find("mask documents needs cu_seqlens_q"), std::string::npos);
  // separate key boundaries: one count for both, non-decreasing, inside [0, kv_len]
  cu = {0, 50, 100};
  dm.cu_seqlens_q = spattn::IndexView::of(cu.data(), {3});
  std::vector<int64_t> ck{0, 60, 30, 100};
  dm.cu_seqlens_k = spattn::IndexView::of(ck.data(), {4});
  EXPECT_NE(fwd(docs, dm).find("cu_seqlens_k has 4 boundaries, cu_seqlens_q 3"), std::string::npos) << fwd(docs, dm);
  dm.cu_seqlens_k = spattn::IndexView::of(ck.data(), {3});
  EXPECT_NE(fwd(docs, dm).find("cu_seqlens_k is not non-decreasing: [1] is 60, [2] is 30"), std::string::npos)
      << fwd(docs, dm);
  ck = {0, 60, 130};
  EXPECT_NE(fwd(docs, dm).find("cu_seqlens_k[2] is 130, outside [0, 100]"), std::string::npos) << fwd(docs, dm);
  ck = {0, 60, 100};
  EXPECT_EQ(fwd(docs, dm), "(no error)");
  dm.cu_seqlens_k = spattn::IndexView::of(ck.data(), {1, 3});
  EXPECT_NE(fwd(docs, dm).find("cu_seqlens_k has 2 dimensions [1, 3], expected 1"), std::string::npos) << fwd(docs, dm);
  dm.cu_seqlens_k = {};
  // a negative count, and a count past the list's width
  num[2] = -1;
  EXPECT_NE(fwd(blocks, bm).find("kv_num_blocks[0, 0, 2] is -1"), std::string::npos) << fwd(blocks, bm);
  num[2] = 1;

  const spattn::Plan topk = runtime_plan(spattn::MaskLayout::topk_keys(3), p, spattn::Engine::reference);
  std::vector<int64_t> tk(100 * 3, -1);
  spattn::RuntimeMask tm;
  tm.topk_indices = spattn::IndexView::of(tk.data(), {1, 100, 3});
  EXPECT_EQ(fwd(topk, tm), "(no error)");
  tk[7] = 100;
  EXPECT_NE(fwd(topk, tm).find("topk_indices[0, 2, 1] is 100, outside [0, 100)"), std::string::npos) << fwd(topk, tm);
  tk[7] = 5, tk[8] = 5;
  EXPECT_NE(fwd(topk, tm).find("topk_indices[0, 2, 2] repeats key 5"), std::string::npos) << fwd(topk, tm);
  tm.topk_indices = spattn::IndexView::of(tk.data(), {1, 100, 1, 3});
  EXPECT_EQ(fwd(topk, tm).find("(no error)"), std::string::npos);
  tk[8] = -1;
  std::vector<int64_t> tk3(100 * 3 * 3, -1);
  tm.topk_indices = spattn::IndexView::of(tk3.data(), {1, 100, 3, 3});  // 3 heads: neither 1, kv_heads nor q_heads
  EXPECT_NE(fwd(topk, tm).find("topk_indices has 3 heads (dimension 2), expected 1, kv_heads (2) or q_heads (2)"),
            std::string::npos)
      << fwd(topk, tm);
  tm.topk_indices = spattn::IndexView::of(tk.data(), {1, 50, 2, 3});
  EXPECT_NE(fwd(topk, tm).find("topk_indices has shape [1, 50, 2, 3], expected [1, 100, 2, 3]"), std::string::npos)
      << fwd(topk, tm);

  // Static plans take no mask, run-time plans need one.
  const spattn::Plan fixed = spattn::make_plan(spattn::parse("causal"), p);
  EXPECT_NE(fwd(fixed, tm).find("built for a static pattern"), std::string::npos);
  EXPECT_FALSE(fixed.takes_mask());
  EXPECT_NE(error_of([&] { docs.forward(c.tq(), c.tk(), c.tv(), to, TensorView{}); }).find("takes its mask at every call"),
            std::string::npos);
  EXPECT_NE(error_of([&] { runtime_plan(spattn::MaskLayout::blocks(0, 32), p, spattn::Engine::cpu_fused); })
                .find("block sizes must be >= 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { spattn::MaskLayout::parse("blocks:128"); }).find("expected blocks:QBxKB"), std::string::npos);
  EXPECT_EQ(spattn::MaskLayout::parse("blocks:64x128:causal & local(3)").str(), "blocks:64x128:causal & local(3)");
  EXPECT_EQ(spattn::MaskLayout::parse("topk:2048:local(left=64, right=0)").topk, 2048);
  EXPECT_EQ(spattn::MaskLayout::parse("documents").str(), "documents");
}

// The C API (src/api/c_api.cpp): a masked plan by its layout's text, forward with the mask's slots.
extern "C" {
struct CIndexView {
  const void* data;
  int32_t bits, ndim;
  int64_t shape[4], stride[4];
};
int spattn_plan_create_masked(const char*, int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double,
                              const char*, void**);
int spattn_plan_forward_masked(void*, const void*, const int64_t*, const void*, const int64_t*, const void*,
                               const int64_t*, void*, const int64_t*, float*, const CIndexView*, int, void*);
void spattn_plan_destroy(void*);
const char* spattn_last_error(void);
}

TEST(RuntimeMask, CApi) {
  const auto p = problem(1, 2, 1, 40, 40, 8);
  Case c(p, 3);
  void* h = nullptr;
  ASSERT_EQ(spattn_plan_create_masked("documents:causal", -1, 2, 1, 2, 1, 40, 40, 8, std::nan(""), "", &h), 0) << spattn_last_error();
  const std::vector<int32_t> cu{0, 13, 40};
  CIndexView slots[7] = {};
  slots[4] = {cu.data(), 32, 1, {3, 0, 0, 0}, {1, 0, 0, 0}};
  std::vector<float> o(c.q.size()), lse(80);
  const int64_t qs[4] = {40 * 2 * 8, 2 * 8, 8, 1}, ks[4] = {40 * 8, 8, 8, 1};
  ASSERT_EQ(spattn_plan_forward_masked(h, c.q.data(), qs, c.k.data(), ks, c.v.data(), ks, o.data(), qs, lse.data(), slots,
                                       1, nullptr),
            0)
      << spattn_last_error();
  std::vector<double> eo, el;
  c.expected([&](int64_t, int64_t, int64_t q, int64_t k) { return k <= q && (q < 13) == (k < 13); }, eo, el);
  EXPECT_LT(max_err(o, eo), 2e-5);
  slots[4].shape[0] = 2;
  const std::vector<int32_t> bad{0, 41};
  slots[4].data = bad.data();
  EXPECT_EQ(spattn_plan_forward_masked(h, c.q.data(), qs, c.k.data(), ks, c.v.data(), ks, o.data(), qs, lse.data(),
                                       slots, 1, nullptr),
            -1);
  EXPECT_NE(std::string(spattn_last_error()).find("cu_seqlens_q[1] is 41"), std::string::npos) << spattn_last_error();
  spattn_plan_destroy(h);
}

}  // namespace
