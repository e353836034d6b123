// Context-parallel attention on GPU ranks (spattn/distributed.hpp): W ranks simulated on one GPU (SimWorld with
// device memory, a stream per rank), bf16, forward and backward against one GPU plan over the whole sequence.
// Skips without a GPU. Written on a machine without one: compiled, not yet run.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gpu/require_gpu.hpp"
#include "spattn/distributed.hpp"

namespace {

using namespace spattn;

struct Dev {  // a device copy of host bf16 words
  void* p = nullptr;
  size_t bytes = 0;
  explicit Dev(const std::vector<uint16_t>& h) : bytes(h.size() * 2) {
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(bytes, 2)), cudaSuccess);
    if (bytes) EXPECT_EQ(cudaMemcpy(p, h.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  explicit Dev(size_t n_bytes) : bytes(n_bytes) { EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(bytes, 2)), cudaSuccess); }
  ~Dev() { cudaFree(p); }
  template <class T>
  std::vector<T> get() const {
    std::vector<T> h(bytes / sizeof(T));
    if (bytes) EXPECT_EQ(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

std::vector<uint16_t> randn_bf16(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd;
  std::vector<uint16_t> x(n);
  for (auto& e : x) e = float_to_bf16(nd(g));
  return x;
}

// The tokens `own` of a [B, L, H, D] host array, in order.
std::vector<uint16_t> shard(const std::vector<uint16_t>& full, const IndexRanges& own, int64_t B, int64_t L, int64_t HD) {
  const int64_t n = total_size(own);
  std::vector<uint16_t> s(size_t(B * n * HD));
  for (int64_t b = 0; b < B; ++b) {
    int64_t i = 0;
    for (const IndexRange& x : own)
      for (int64_t g = x.begin; g < x.end; ++g, ++i)
        std::copy_n(&full[size_t((b * L + g) * HD)], HD, &s[size_t((b * n + i) * HD)]);
  }
  return s;
}

double rel_l2(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double a = bf16_to_float(got[i]), b = bf16_to_float(want[i]);
    num += (a - b) * (a - b);
    den += b * b;
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

void check(const std::string& spec, int64_t L, int world, const std::string& layout) {
  SCOPED_TRACE(spec + " L=" + std::to_string(L) + " W=" + std::to_string(world) + " " + layout);
  const int64_t B = 1, H = 2, D = 64, HD = H * D;
  const Problem pr{.batch = B, .q_heads = H, .kv_heads = H, .q_len = L, .kv_len = L, .head_dim = D, .dtype = DType::bf16};
  const std::vector<uint16_t> q = randn_bf16(size_t(B * L * HD), 1), k = randn_bf16(size_t(B * L * HD), 2),
                              v = randn_bf16(size_t(B * L * HD), 3), dout = randn_bf16(size_t(B * L * HD), 4);
  auto view = [&](void* p, int64_t n) { return TensorView::contiguous(p, DType::bf16, {B, n, H, D}); };
  auto lse_view = [&](void* p, int64_t n) { return TensorView::contiguous(p, DType::f32, {B, H, n, 1}); };
  // One GPU over the whole sequence.
  const Plan one = make_plan(parse(spec), pr, Device::cuda(0));
  Dev dq1(q), dk1(k), dv1(v), dd1(dout), o1(q.size() * 2), l1(size_t(B * H * L) * 4), gq1(q.size() * 2), gk1(k.size() * 2),
      gv1(v.size() * 2);
  one.forward(view(dq1.p, L), view(dk1.p, L), view(dv1.p, L), view(o1.p, L), lse_view(l1.p, L));
  one.backward(view(dq1.p, L), view(dk1.p, L), view(dv1.p, L), view(o1.p, L), lse_view(l1.p, L), view(dd1.p, L),
               view(gq1.p, L), view(gk1.p, L), view(gv1.p, L));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> want_o = o1.get<uint16_t>(), want_dq = gq1.get<uint16_t>(), want_dk = gk1.get<uint16_t>(),
                              want_dv = gv1.get<uint16_t>();
  // W ranks on the same GPU.
  const dist::DistPlan plan({parse(spec)}, pr, dist::ShardLayout::parse(layout, L, world), {.distribute_rows = false});
  dist::SimWorld sim(world, Device::cuda(0));
  std::vector<double> err(size_t(world) * 4, 1.0);
  sim.run([&](int r, dist::Communicator& comm) {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    const IndexRanges& own = plan.layout().owned[size_t(r)];
    const int64_t n = total_size(own);
    cudaStream_t st = nullptr;
    ASSERT_EQ(cudaStreamCreate(&st), cudaSuccess);
    Dev sq(shard(q, own, B, L, HD)), sk(shard(k, own, B, L, HD)), sv(shard(v, own, B, L, HD)),
        sd(shard(dout, own, B, L, HD)), so(size_t(B * n * HD) * 2), sl(size_t(B * H * n) * 4), gq(size_t(B * n * HD) * 2),
        gk(size_t(B * n * HD) * 2), gv(size_t(B * n * HD) * 2);
    const dist::DistRank rank(plan, r, Device::cuda(0));
    rank.forward(comm, view(sq.p, n), view(sk.p, n), view(sv.p, n), view(so.p, n), lse_view(sl.p, n), st);
    rank.backward(comm, view(sq.p, n), view(sk.p, n), view(sv.p, n), view(so.p, n), lse_view(sl.p, n), view(sd.p, n),
                  view(gq.p, n), view(gk.p, n), view(gv.p, n), st);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    cudaStreamDestroy(st);
    err[size_t(r) * 4 + 0] = rel_l2(so.get<uint16_t>(), shard(want_o, own, B, L, HD));
    err[size_t(r) * 4 + 1] = rel_l2(gq.get<uint16_t>(), shard(want_dq, own, B, L, HD));
    err[size_t(r) * 4 + 2] = rel_l2(gk.get<uint16_t>(), shard(want_dk, own, B, L, HD));
    err[size_t(r) * 4 + 3] = rel_l2(gv.get<uint16_t>(), shard(want_dv, own, B, L, HD));
  });
  const char* names[] = {"o", "dq", "dk", "dv"};
  for (int r = 0; r < world; ++r)
    for (int i = 0; i < 4; ++i)  // bf16 outputs; the parts round once more than one plan does
      EXPECT_LE(err[size_t(r) * 4 + size_t(i)], 2e-2) << "rank " << r << " " << names[i];
}

TEST(DistGpu, LocalSimulatedRanksOnOneGpu) {
  REQUIRE_GPU();
  check("local(64)", 2048, 2, "contiguous");
  check("local(64)", 2048, 4, "contiguous");
}

TEST(DistGpu, CausalZigzagAndLongformer) {
  REQUIRE_GPU();
  check("causal", 1024, 2, "zigzag");
  check("longformer(32, 16)", 1024, 2, "contiguous");
}

TEST(DistGpu, GlobalRowsShippedAreRefused) {
  REQUIRE_GPU();
  const Problem pr{.batch = 1, .q_heads = 2, .kv_heads = 2, .q_len = 256, .kv_len = 256, .head_dim = 64,
                   .dtype = DType::bf16};
  const dist::DistPlan plan({parse("longformer(8, 4)")}, pr, dist::ShardLayout::contiguous(256, 2));
  try {
    dist::DistRank(plan, 0, Device::cuda(0));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("distribute_rows = false"), std::string::npos) << e.what();
  }
}

}  // namespace
