// Context-parallel attention (spattn/distributed.hpp) with W ranks simulated in one process on the CPU engine:
// window patterns (BoundPattern::window) against their base; the exchange schedule (keys fetched, bytes against the
// boundary volume, bytes the simulated communicator counted); forward and backward equal to one device's plan and to
// the fp64 reference; bad inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "spattn/distributed.hpp"

namespace {

using namespace spattn;
using dist::DistPlan;
using dist::ShardLayout;

// ---- window patterns ---------------------------------------------------------------------------------------

// Every (i, j) of the window: row() and contains() agree with the base at the mapped indices.
void expect_window(const BoundPattern& base, const IndexRanges& rows, const IndexRanges& keys, const IndexRanges& skip) {
  const BoundPattern w = BoundPattern::window(base, rows, keys, skip);
  std::vector<int64_t> qs, ks;
  for (const IndexRange& r : rows)
    for (int64_t g = r.begin; g < r.end; ++g) qs.push_back(g);
  for (const IndexRange& r : keys)
    for (int64_t g = r.begin; g < r.end; ++g) ks.push_back(g);
  ASSERT_EQ(w.q_len(), int64_t(qs.size()));
  ASSERT_EQ(w.k_len(), int64_t(ks.size()));
  std::vector<int64_t> got;
  for (int64_t i = 0; i < w.q_len(); ++i) {
    bool skipped = false;
    for (const IndexRange& s : skip) skipped = skipped || (qs[size_t(i)] >= s.begin && qs[size_t(i)] < s.end);
    std::vector<int64_t> want;
    for (int64_t j = 0; j < w.k_len(); ++j) {
      const bool in = !skipped && base.contains(qs[size_t(i)], ks[size_t(j)]);
      ASSERT_EQ(w.contains(i, j), in) << base.spec() << " (" << i << ", " << j << ")";
      if (in) want.push_back(j);
    }
    w.row_keys(i, got);
    ASSERT_EQ(got, want) << base.spec() << " row " << i;
  }
}

TEST(DistWindow, MatchesBaseThroughRanges) {
  // Strided runs (dilated, stride, neighborhood), scattered keys (random), dense rows and columns; ranges out of
  // order, touching, empty.
  for (const char* spec : {"local(5)", "dilated(4, 3)", "stride(7) & causal", "random(6, seed=3)", "longformer(3, 2)",
                           "neighborhood(dims=(10,12), kernel=3, dilation=2)", "sparse_fixed(16, 2)"}) {
    const BoundPattern base = parse(spec).bind(120);
    expect_window(base, {{30, 50}, {0, 10}}, {{40, 60}, {0, 25}, {60, 61}, {100, 100}}, {});
    expect_window(base, {{0, 120}}, {{70, 120}, {0, 10}}, {{5, 8}, {60, 64}});
  }
}

TEST(DistWindow, BandThroughOneRangeStaysABand) {
  // A shard's rows against its own keys and its halo: the band's spec moves its diagonal (the planners see a band).
  // (spec, how far left its band reaches: the diagonal may move that far)
  for (auto [spec, left] : {std::pair{"local(6)", 6}, {"local(left=9, right=0)", 9}, {"causal", 1000}, {"dense", 1000},
                            {"local(left=2, right=3)", 2}}) {
    const BoundPattern base = parse(spec).bind(100);
    for (auto [rows, keys] : {std::pair{IndexRange{30, 60}, IndexRange{24, 66}}, {IndexRange{0, 40}, IndexRange{0, 46}},
                              {IndexRange{70, 100}, IndexRange{61, 100}}, {IndexRange{30, 60}, IndexRange{30, 60}}}) {
      expect_window(base, {rows}, {keys}, {});
      const BoundPattern w = BoundPattern::window(base, {rows}, {keys});
      EXPECT_EQ(w.spec().rfind("window#", 0) == 0, rows.begin - keys.begin > left) << spec << ": " << w.spec();
    }
  }
  // Where the band cannot move (left would go negative) the window is the general one, and still exact.
  const BoundPattern base = parse("local(left=2, right=3)").bind(100);
  EXPECT_EQ(BoundPattern::window(base, {{30, 60}}, {{20, 70}}).spec().rfind("window#", 0), 0u);
  expect_window(base, {{30, 60}}, {{20, 70}}, {});
}

TEST(DistWindow, BadRangesNamed) {
  const BoundPattern base = parse("local(2)").bind(50);
  EXPECT_THROW(
      {
        try {
          BoundPattern::window(base, {{0, 10}}, {{0, 20}, {15, 30}});
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("key ranges 0 [0, 20) and 1 [15, 30) overlap"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  EXPECT_THROW(BoundPattern::window(base, {{40, 60}}, {{0, 5}}), Error);
  EXPECT_THROW(BoundPattern::window(base, {{5, 3}}, {{0, 5}}), Error);
}

// ---- the schedule ------------------------------------------------------------------------------------------

Problem problem_of(int64_t L, int64_t hq = 2, int64_t hkv = 2, int64_t d = 16, int64_t batch = 1) {
  return Problem{.batch = batch, .q_heads = hq, .kv_heads = hkv, .q_len = L, .kv_len = L, .head_dim = d,
                 .dtype = DType::f32};
}

TEST(DistSchedule, LocalFetchesExactlyTheHalo) {
  const int64_t L = 1000, w = 16;
  const Problem pr = problem_of(L, 4, 2, 32, 2);
  const DistPlan plan({parse("local(16)")}, pr, ShardLayout::contiguous(L, 4));
  for (int r = 0; r < 4; ++r) {
    const dist::RankPlan& rp = plan.rank(r);
    const int64_t q0 = L * r / 4, q1 = L * (r + 1) / 4;
    IndexRanges want;
    if (r > 0) want.push_back({q0 - w, q0});
    if (r < 3) want.push_back({q1, q1 + w});
    EXPECT_EQ(rp.fetched, want) << plan.explain();
    EXPECT_EQ(rp.boundary_keys, (r > 0 ? w : 0) + (r < 3 ? w : 0));
    EXPECT_EQ(rp.kv_recv_bytes, rp.boundary_bytes);  // exactly the boundary volume
    EXPECT_EQ(rp.boundary_bytes, rp.boundary_keys * 2 * 2 * (32 + 32) * 4);  // B x Hkv x (D + Dv) x fp32
    EXPECT_EQ(rp.recv_bytes, rp.kv_recv_bytes);  // no global rows
  }
  // Key blocks of 64 round a halo of 300 keys out to 320: within 10% of the boundary volume (the bar's local(4096)
  // with blocks of 128 is exact).
  const DistPlan blocked({parse("local(300)")}, problem_of(4096), ShardLayout::contiguous(4096, 4), {.key_block = 64});
  for (int r = 0; r < 4; ++r) {
    const dist::RankPlan& rp = blocked.rank(r);
    EXPECT_EQ(rp.fetched_keys, (r > 0 ? 320 : 0) + (r < 3 ? 320 : 0)) << blocked.explain();
    EXPECT_LE(double(rp.kv_recv_bytes), 1.1 * double(rp.boundary_bytes));
  }
  EXPECT_NE(plan.explain().find("ratio 1.000"), std::string::npos) << plan.explain();
}

TEST(DistSchedule, RankWithNoRemoteKeys) {
  const DistPlan plan({parse("block_diag(50)")}, problem_of(200), ShardLayout::contiguous(200, 4));
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(plan.rank(r).fetched.empty());
    EXPECT_EQ(plan.rank(r).recv_bytes, 0);
  }
}

TEST(DistSchedule, GlobalColumnsOnceGlobalRowsShipped) {
  // longformer(4, 3): rows 0..2 keep every key (their queries go to every rank, not every key to rank 0); columns
  // 0..2 are fetched once by each other rank, however many of its rows see them.
  const DistPlan plan({parse("longformer(4, 3)")}, problem_of(400), ShardLayout::contiguous(400, 4));
  EXPECT_EQ(plan.rank(0).skipped, (IndexRanges{{0, 3}}));
  EXPECT_EQ(plan.rank(0).fetched, (IndexRanges{{100, 104}}));
  EXPECT_EQ(plan.rank(2).fetched, (IndexRanges{{0, 3}, {196, 200}, {300, 304}}));
  EXPECT_EQ(plan.rank(2).row_queries, (IndexRanges{{0, 3}}));
}

TEST(DistSchedule, ZigzagBalancesCausal) {
  const int64_t L = 4096;
  const DistPlan zig({parse("causal")}, problem_of(L), ShardLayout::zigzag(L, 4));
  const DistPlan con({parse("causal")}, problem_of(L), ShardLayout::contiguous(L, 4));
  auto balance = [](const DistPlan& p) {
    int64_t mx = 0, sum = 0;
    for (int r = 0; r < p.world(); ++r) {
      const dist::RankPlan& rp = p.rank(r);
      mx = std::max(mx, rp.nnz_local + rp.nnz_remote + rp.nnz_rows);
      sum += rp.nnz_local + rp.nnz_remote + rp.nnz_rows;
    }
    EXPECT_EQ(sum, L * (L + 1) / 2);
    return double(sum) / p.world() / double(mx);
  };
  EXPECT_GT(balance(zig), 0.99);
  EXPECT_LT(balance(con), 0.6);
  EXPECT_EQ(zig.rank(1).owned, (IndexRanges{{512, 1024}, {3072, 3584}}));
}

TEST(DistSchedule, BadInputsNamed) {
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { ShardLayout::contiguous(100, 0); }).find("W = 0 must be >= 1"), std::string::npos);
  EXPECT_NE(message([] { ShardLayout::contiguous(3, 4); }).find("W = 4 needs L >= 4"), std::string::npos);
  EXPECT_NE(message([] { ShardLayout::zigzag(7, 4); }).find("W = 4 needs L >= 8"), std::string::npos);
  EXPECT_NE(message([] { ShardLayout::from_ranges(10, {{{0, 4}}, {{5, 10}}}); }).find("tokens [4, 5) belong to no rank"),
            std::string::npos);
  EXPECT_NE(message([] { ShardLayout::from_ranges(10, {{{0, 6}}, {{5, 10}}}); }).find("token 5 belongs to two ranges"),
            std::string::npos);
  EXPECT_NE(message([] { ShardLayout::from_ranges(10, {{{0, 6}}, {{6, 11}}}); }).find("[6, 11) is not a range inside"),
            std::string::npos);
  EXPECT_NE(message([] { DistPlan({parse("local(2)")}, problem_of(100), ShardLayout::contiguous(90, 2)); })
                .find("covers L = 90 tokens, the problem 100"),
            std::string::npos);
  EXPECT_NE(message([] { DistPlan({parse("local(2)")}, problem_of(100), ShardLayout::contiguous(100, 2), {.key_block = 0}); })
                .find("key_block = 0"),
            std::string::npos);
  Problem cross = problem_of(100);
  cross.kv_len = 50;
  EXPECT_NE(message([&] { DistPlan({parse("local(2)")}, cross, ShardLayout::contiguous(100, 2)); }).find("q_len 100 != kv_len 50"),
            std::string::npos);
  EXPECT_NE(message([] { dist::SimWorld(0); }).find("W = 0"), std::string::npos);
  const DistPlan plan({parse("local(2)")}, problem_of(100), ShardLayout::contiguous(100, 2));
  EXPECT_NE(message([&] { dist::DistRank(plan, 2); }).find("rank 2 is not in [0, 2)"), std::string::npos);
  EXPECT_NE(message([&] { dist::DistRank(plan, 0, Device::cuda(0)); }).find("distributed attention on cuda"),
            std::string::npos);
}

TEST(DistSim, ARankThatThrowsWakesTheOthers) {
  dist::SimWorld w(3);
  for (int round = 0; round < 2; ++round) {  // and the world is usable again after a failed run
    try {
      w.run([](int r, dist::Communicator& c) {
        if (r == 1) throw Error("rank 1 broke");
        int x = 0;
        c.recv(&x, 4, 1);
        c.wait();
      });
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1 broke"), std::string::npos) << e.what();
    }
  }
  try {
    w.run([](int r, dist::Communicator& c) {
      int64_t x = 7;
      if (r == 0) c.send(&x, 8, 1);
      if (r == 1) {
        c.recv(&x, 4, 0);
        c.wait();
      }
    });
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a message of 8 bytes from rank 0 where 4 were expected"), std::string::npos)
        << e.what();
  }
}

// ---- forward and backward against one device ---------------------------------------------------------------

struct Full {  // the whole sequence's tensors, [B, L, H, D] contiguous fp32
  std::vector<float> q, k, v, dout, o, lse, dq, dk, dv;
};

struct Case {
  std::string spec;
  int64_t L;
  int world;
  std::string layout;  // contiguous, zigzag, or "odd" (a hand-made layout)
  int64_t hq = 2, hkv = 2, d = 16, batch = 1, key_block = 1;
  bool halo = true;  // DistOptions::halo
};

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(n);
  for (float& e : x) e = nd(g);
  return x;
}

TensorView view(std::vector<float>& x, int64_t B, int64_t L, int64_t H, int64_t D) {
  return TensorView::contiguous(x.data(), DType::f32, {B, L, H, D});
}

// "a; b": one pattern per query head.
std::vector<Pattern> patterns_of(const std::string& spec) {
  std::vector<Pattern> out;
  size_t at = 0;
  for (size_t semi; (semi = spec.find(';', at)) != std::string::npos; at = semi + 1) out.push_back(parse(spec.substr(at, semi - at)));
  out.push_back(parse(spec.substr(at)));
  return out;
}

// One device's plan (engine given) on the whole sequence: o, lse, dq, dk, dv.
void single(const Case& c, Engine engine, Full& f) {
  const Problem pr = problem_of(c.L, c.hq, c.hkv, c.d, c.batch);
  const Plan plan = make_plan(patterns_of(c.spec), pr, Device::cpu(), {.engine = engine});
  const int64_t B = c.batch, L = c.L;
  f.o.assign(size_t(B * L * c.hq * c.d), 0.f);
  f.lse.assign(size_t(B * c.hq * L), 0.f);
  f.dq.assign(f.q.size(), 0.f);
  f.dk.assign(f.k.size(), 0.f);
  f.dv.assign(f.v.size(), 0.f);
  const TensorView q = view(f.q, B, L, c.hq, c.d), k = view(f.k, B, L, c.hkv, c.d), v = view(f.v, B, L, c.hkv, c.d);
  const TensorView o = view(f.o, B, L, c.hq, c.d), lse = view(f.lse, B, c.hq, L, 1);
  plan.forward(q, k, v, o, lse);
  plan.backward(q, k, v, o, lse, view(f.dout, B, L, c.hq, c.d), view(f.dq, B, L, c.hq, c.d),
                view(f.dk, B, L, c.hkv, c.d), view(f.dv, B, L, c.hkv, c.d));
}

ShardLayout layout_of(const Case& c) {
  if (c.layout == "odd") {  // out of order, uneven, one rank with two far-apart ranges
    std::vector<IndexRanges> owned(size_t(c.world));
    const int64_t L = c.L;
    owned[0] = {{L / 2, L / 2 + L / 7}, {0, L / 5}};
    owned[1] = {{L / 5, L / 2}};
    owned[size_t(c.world - 1)].push_back({L / 2 + L / 7, L});
    return ShardLayout::from_ranges(L, owned);
  }
  return ShardLayout::parse(c.layout, c.L, c.world);
}

// The simulated ranks: each gets its tokens, runs forward and backward; the results land in f (global order).
// Returns the bytes the communicator counted per rank (forward).
std::vector<int64_t> distributed(const Case& c, Full& f, const DistPlan& plan) {
  const int64_t B = c.batch, L = c.L;
  f.o.assign(size_t(B * L * c.hq * c.d), -7.f);
  f.lse.assign(size_t(B * c.hq * L), -7.f);
  f.dq.assign(f.q.size(), -7.f);
  f.dk.assign(f.k.size(), -7.f);
  f.dv.assign(f.v.size(), -7.f);
  dist::SimWorld world(c.world);
  std::vector<int64_t> fwd_bytes(size_t(c.world));
  world.run([&](int r, dist::Communicator& comm) {
    const IndexRanges& own = plan.layout().owned[size_t(r)];
    const int64_t n = total_size(own);
    // Shard tensors: [B, n, H, D], the rank's tokens in its ranges' order.
    auto shard = [&](std::vector<float>& full, int64_t H) {
      std::vector<float> s(size_t(B * n * H * c.d));
      for (int64_t b = 0; b < B; ++b) {
        int64_t i = 0;
        for (const IndexRange& x : own)
          for (int64_t g = x.begin; g < x.end; ++g, ++i)
            std::copy_n(&full[size_t(((b * L + g) * H) * c.d)], H * c.d, &s[size_t(((b * n + i) * H) * c.d)]);
      }
      return s;
    };
    auto unshard = [&](const std::vector<float>& s, std::vector<float>& full, int64_t H) {
      for (int64_t b = 0; b < B; ++b) {
        int64_t i = 0;
        for (const IndexRange& x : own)
          for (int64_t g = x.begin; g < x.end; ++g, ++i)
            std::copy_n(&s[size_t(((b * n + i) * H) * c.d)], H * c.d, &full[size_t(((b * L + g) * H) * c.d)]);
      }
    };
    std::vector<float> q = shard(f.q, c.hq), k = shard(f.k, c.hkv), v = shard(f.v, c.hkv), dout = shard(f.dout, c.hq);
    std::vector<float> o(q.size()), lse(size_t(B * c.hq * n)), dq(q.size()), dk(k.size()), dv(v.size());
    const dist::DistRank rank(plan, r, Device::cpu(), {.threads = 1});
    const TensorView qv = view(q, B, n, c.hq, c.d), kv = view(k, B, n, c.hkv, c.d), vv = view(v, B, n, c.hkv, c.d);
    const TensorView ov = view(o, B, n, c.hq, c.d), lv = view(lse, B, c.hq, n, 1);
    rank.forward(comm, qv, kv, vv, ov, lv);
    fwd_bytes[size_t(r)] = comm.bytes_received();
    rank.backward(comm, qv, kv, vv, ov, lv, view(dout, B, n, c.hq, c.d), view(dq, B, n, c.hq, c.d),
                  view(dk, B, n, c.hkv, c.d), view(dv, B, n, c.hkv, c.d));
    unshard(o, f.o, c.hq);
    unshard(dq, f.dq, c.hq);
    unshard(dk, f.dk, c.hkv);
    unshard(dv, f.dv, c.hkv);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < c.hq; ++h) {
        int64_t i = 0;
        for (const IndexRange& x : own)
          for (int64_t g = x.begin; g < x.end; ++g, ++i)
            f.lse[size_t((b * c.hq + h) * L + g)] = lse[size_t((b * c.hq + h) * n + i)];
      }
  });
  return fwd_bytes;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i]) || std::isinf(got[i])) {
      ASSERT_EQ(got[i], want[i]) << what << " at " << i;
      continue;
    }
    const double e = std::abs(double(got[i]) - double(want[i])) / (1.0 + std::abs(double(want[i])));
    if (!(e <= worst)) worst = e, at = i;
  }
  EXPECT_LE(worst, tol) << what << ": worst relative error " << worst << " at " << at << " (got " << got[at]
                        << ", want " << want[at] << ")";
}

void check_case(const Case& c) {
  SCOPED_TRACE(c.spec + " L=" + std::to_string(c.L) + " W=" + std::to_string(c.world) + " " + c.layout);
  Full f;
  const int64_t B = c.batch, L = c.L;
  f.q = randn(size_t(B * L * c.hq * c.d), 1);
  f.k = randn(size_t(B * L * c.hkv * c.d), 2);
  f.v = randn(size_t(B * L * c.hkv * c.d), 3);
  f.dout = randn(size_t(B * L * c.hq * c.d), 4);
  Full one = f, ref = f, dst = f;
  single(c, Engine::cpu_fused, one);
  single(c, Engine::reference, ref);
  const DistPlan plan(patterns_of(c.spec), problem_of(L, c.hq, c.hkv, c.d, B), layout_of(c),
                      {.key_block = c.key_block, .halo = c.halo});
  const std::vector<int64_t> bytes = distributed(c, dst, plan);
  for (int r = 0; r < c.world; ++r) EXPECT_EQ(bytes[size_t(r)], plan.rank(r).recv_bytes) << "rank " << r;
  for (auto [got, a, b, name] : {std::tuple{&dst.o, &one.o, &ref.o, "o"}, {&dst.lse, &one.lse, &ref.lse, "lse"},
                                 {&dst.dq, &one.dq, &ref.dq, "dq"}, {&dst.dk, &one.dk, &ref.dk, "dk"},
                                 {&dst.dv, &one.dv, &ref.dv, "dv"}}) {
    expect_close(*got, *a, 2e-5, std::string(name) + " vs one device");
    expect_close(*got, *b, 1e-4, std::string(name) + " vs fp64 reference");
  }
}

TEST(DistRun, LocalContiguous) {
  for (int w : {2, 3, 4}) check_case({"local(9)", 301, w, "contiguous"});                       // halo mode
  for (int w : {2, 4}) check_case({"local(9)", 301, w, "contiguous", 2, 2, 16, 1, 1, false});  // local + remote parts
}
TEST(DistRun, HaloModeIsOneBandPlan) {
  const DistPlan plan({parse("local(16)")}, problem_of(400), ShardLayout::contiguous(400, 4));
  const std::string e = dist::DistRank(plan, 1).explain();
  EXPECT_NE(e.find("halo: keys 84:216 (own and fetched) in one buffer, 1 plan(s)"), std::string::npos) << e;
  EXPECT_NE(e.find("local(left=0, right=32)"), std::string::npos) << e;  // a band again: the band tiler runs it
  const DistPlan parts({parse("local(16)")}, problem_of(400), ShardLayout::contiguous(400, 4), {.halo = false});
  EXPECT_EQ(dist::DistRank(parts, 1).explain().find("halo:"), std::string::npos);
}
TEST(DistRun, LocalWiderThanAShard) { check_case({"local(40)", 97, 4, "contiguous"}); }
TEST(DistRun, CausalZigzag) {
  for (int w : {2, 3, 4}) check_case({"causal", 257, w, "zigzag"});  // halo mode: two band plans a rank
  check_case({"causal", 257, 3, "zigzag", 2, 2, 16, 1, 1, false});   // local + remote parts, merged
  // Rank 0 owns chunks 0 and 7 of 8: its keys [0, L) in one buffer (rank 1's two chunks staged, then placed), each
  // chunk of rows a causal band over them.
  const DistPlan plan({parse("causal")}, problem_of(800), ShardLayout::zigzag(800, 4));
  const std::string e = dist::DistRank(plan, 0).explain();
  EXPECT_NE(e.find("halo: keys 0:800 (own and fetched) in one buffer, 2 plan(s)"), std::string::npos) << e;
  EXPECT_NE(e.find("local(left=100, right=0)"), std::string::npos) << e;    // chunk 0 against keys 0:800
  EXPECT_NE(e.find("local(left=100, right=700)"), std::string::npos) << e;  // chunk 7
}
TEST(DistRun, LongformerGlobalRowsAndColumns) {
  for (int w : {2, 4}) check_case({"longformer(6, 3)", 263, w, "contiguous", 4, 2});
}
TEST(DistRun, DilatedRandomCompound) {
  check_case({"dilated(5, 3)", 250, 3, "contiguous"});
  check_case({"random(7, seed=5)", 230, 4, "contiguous", 2, 2, 16, 1, 8});
  check_case({"local(4) | random(3, seed=2) | global_cols(0:2) | (stride(11) & causal)", 311, 3, "zigzag"});
}
TEST(DistRun, GqaBatchOddLayout) { check_case({"sparse_strided(8) | global(100:104)", 280, 3, "odd", 4, 1, 8, 2}); }
TEST(DistRun, PerHeadPatterns) {
  check_case({"local(3); causal; dilated(4, 2); longformer(5, 2)", 203, 3, "contiguous", 4, 2});
  check_case({"causal; local(left=6, right=0)", 203, 2, "zigzag"});
}

TEST(DistSchedule, FetchedKeysAreExactlyTheRemoteKeysTheRowsKeep) {
  // keys_reached (difference arrays per stride) against brute force over every (q, k), for every rank.
  const int64_t L = 180;
  for (const char* spec : {"local(7)", "dilated(3, 4)", "stride(9) & causal", "random(5, seed=2)", "sparse_fixed(16, 2)",
                           "neighborhood(dims=(12,15), kernel=3, dilation=2)", "local(2) | global_cols(50, 120:123)",
                           "blocked(8, local(1) | random(2, seed=3))"}) {
    for (const char* layout : {"contiguous", "zigzag"}) {
      const DistPlan plan({parse(spec)}, problem_of(L), ShardLayout::parse(layout, L, 3), {.distribute_rows = false});
      const BoundPattern p = parse(spec).bind(L);
      for (int r = 0; r < 3; ++r) {
        const dist::RankPlan& rp = plan.rank(r);
        std::vector<char> own(size_t(L), 0), need(size_t(L), 0);
        for (const IndexRange& x : rp.owned)
          for (int64_t t = x.begin; t < x.end; ++t) own[size_t(t)] = 1;
        for (int64_t q = 0; q < L; ++q)
          if (own[size_t(q)])
            for (int64_t k = 0; k < L; ++k) need[size_t(k)] |= !own[size_t(k)] && p.contains(q, k);
        IndexRanges want;
        for (int64_t k = 0; k < L; ++k)
          if (need[size_t(k)]) {
            if (!want.empty() && want.back().end == k) ++want.back().end;
            else want.push_back({k, k + 1});
          }
        IndexRanges got = rp.fetched;
        std::sort(got.begin(), got.end(), [](const IndexRange& a, const IndexRange& b) { return a.begin < b.begin; });
        IndexRanges merged;  // (ranges from two sources may touch)
        for (const IndexRange& x : got) {
          if (!merged.empty() && merged.back().end == x.begin) merged.back().end = x.end;
          else merged.push_back(x);
        }
        EXPECT_EQ(merged, want) << spec << " " << layout << " rank " << r;
      }
    }
  }
}

TEST(DistRun, NoRemoteKeysAndEmptyRows) {
  check_case({"block_diag(50)", 200, 4, "contiguous"});
  check_case({"causal & global_cols(150:170)", 240, 3, "contiguous"});  // rows < 150 keep nothing
}

}  // namespace
