// Scratch (not committed): attention with P on the tile path, plain stream vs captured CUDA graph (PDL edges).
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "spattn/multigrain.hpp"
using namespace spattn;
namespace mg = spattn::multigrain;
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("FAIL %s: %s\n", #x, cudaGetErrorString(e_)); return 1; } } while (0)
int main() {
  int fails = 0;
  for (int64_t L : {799, 4096}) {
    Problem pr;
    pr.batch = 2; pr.q_heads = 4; pr.kv_heads = 4; pr.q_len = pr.kv_len = L; pr.head_dim = 64; pr.dtype = DType::bf16;
    const BoundPattern bp = Pattern::parse("random(" + std::to_string((L + 19) / 20) + ", seed=0)").bind(L);
    mg::Options opt;
    const mg::Plan plan = mg::Plan::build(bp, pr, opt);
    const int64_t n = pr.batch * L * pr.q_heads * 64, nb = pr.batch * pr.q_heads, fe = plan.fine_elems_per_head();
    std::vector<uint16_t> h(size_t(3 * n));
    std::mt19937 rng(1);
    for (auto& x : h) { float f = std::uniform_real_distribution<float>(-2, 2)(rng); uint32_t u; std::memcpy(&u, &f, 4); x = uint16_t(u >> 16); }
    void *q, *k, *v, *o1, *o2, *p1, *p2, *l1, *l2, *ws;
    CK(cudaMalloc(&q, n * 2)); CK(cudaMalloc(&k, n * 2)); CK(cudaMalloc(&v, n * 2));
    CK(cudaMalloc(&o1, n * 2)); CK(cudaMalloc(&o2, n * 2)); CK(cudaMalloc(&p1, nb * fe * 2)); CK(cudaMalloc(&p2, nb * fe * 2));
    CK(cudaMalloc(&l1, nb * L * 4)); CK(cudaMalloc(&l2, nb * L * 4)); CK(cudaMalloc(&ws, plan.attention_workspace_size(true)));
    CK(cudaMemcpy(q, h.data(), n * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(k, h.data() + n, n * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(v, h.data() + 2 * n, n * 2, cudaMemcpyHostToDevice));
    auto tv = [&](void* p) { return TensorView::contiguous(p, DType::bf16, {pr.batch, L, pr.q_heads, 64}); };
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    plan.attention(tv(q), tv(k), tv(v), tv(o1), static_cast<float*>(l1), {nullptr, p1}, ws, s);
    CK(cudaStreamSynchronize(s));
    CK(cudaMemset(o2, 0xff, n * 2)); CK(cudaMemset(p2, 0xff, nb * fe * 2)); CK(cudaMemset(l2, 0xff, nb * L * 4));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int r = 0; r < 2; ++r) plan.attention(tv(q), tv(k), tv(v), tv(o2), static_cast<float*>(l2), {nullptr, p2}, ws, s);
    CK(cudaStreamEndCapture(s, &g));
    size_t nodes = 0;
    CK(cudaGraphGetNodes(g, nullptr, &nodes));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int r = 0; r < 3; ++r) CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    std::vector<char> a(size_t(nb * fe * 2)), b(a.size());
    auto same = [&](void* x, void* y, size_t bytes) {
      a.resize(bytes); b.resize(bytes);
      cudaMemcpy(a.data(), x, bytes, cudaMemcpyDeviceToHost); cudaMemcpy(b.data(), y, bytes, cudaMemcpyDeviceToHost);
      return std::memcmp(a.data(), b.data(), bytes) == 0;
    };
    const bool okO = same(o1, o2, n * 2), okP = same(p1, p2, nb * fe * 2), okL = same(l1, l2, nb * L * 4);
    std::printf("capture L=%lld: graph nodes %zu; O %s, P %s, LSE %s (graph replay == stream run, bitwise)\n", (long long)L, nodes,
                okO ? "same" : "DIFFERENT", okP ? "same" : "DIFFERENT", okL ? "same" : "DIFFERENT");
    fails += !(okO && okP && okL);
    // Timing, graph vs stream (median of 31 single calls).
    for (int mode = 0; mode < 2; ++mode) {
      std::vector<float> t;
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0); cudaEventCreate(&e1);
      for (int r = 0; r < 31; ++r) {
        cudaEventRecord(e0, s);
        if (mode == 0) plan.attention(tv(q), tv(k), tv(v), tv(o1), static_cast<float*>(l1), {nullptr, p1}, ws, s);
        else cudaGraphLaunch(ge, s);
        cudaEventRecord(e1, s);
        cudaEventSynchronize(e1);
        float ms; cudaEventElapsedTime(&ms, e0, e1); t.push_back(mode ? ms / 2 : ms);
      }
      std::sort(t.begin(), t.end());
      std::printf("  %s: %.4f ms per attention call\n", mode ? "graph (2 calls per replay)" : "stream", t[15]);
    }
  }
  std::printf("capture check: %s\n", fails ? "FAILED" : "ok");
  return fails ? 1 : 0;
}
