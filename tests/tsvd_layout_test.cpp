// The TSVD GPU kernels' shared-memory layouts (src/cuda/tsvd/smem_layout.hpp), checked on the CPU: every cp.async
// and ldmatrix address of the mma.sync kernel and every TMA box of the wgmma kernel lies inside its region, the
// regions inside the bytes the host asks for, the reads inside what the loads wrote. Guards against the mma.sync
// kernel's first A_ij^T layout, whose B buffers began 2 x kBK rows past A's while the host counted 2 x RP rows
// (compute-sanitizer on an H100: "Invalid __shared__ write of size 16" in tsvd_mma<bf16, 16>, every later test
// failing with an illegal address).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "cuda/tsvd/smem_layout.hpp"

namespace ck = spattn::cuda::tsvd;

namespace {

// The padded ranks the mma.sync kernel is instantiated for (kernels.cu's launch_mma_rp) and the wgmma kernel's
// (rank, BN) instantiations (wgmma.cu's launch_b).
const int kMmaRanks[] = {16, 32, 64, 128};
const std::pair<int, int> kWgShapes[] = {{16, 128}, {32, 128}, {64, 128}, {128, 128}, {16, 256}, {32, 256}, {64, 256}};

struct Region {
  const char* name;
  int lo, hi;  // [lo, hi) elements
};

// Element range [e, e + 8) (16 bytes) lies in r and is 16-byte aligned.
void expect_vec_in(int e, const Region& r, const std::string& what) {
  EXPECT_EQ(e % 8, 0) << what << ": element " << e << " is not 16-byte aligned";
  EXPECT_GE(e, r.lo) << what << ": element " << e << " is before " << r.name << " [" << r.lo << ", " << r.hi << ")";
  EXPECT_LE(e + 8, r.hi) << what << ": elements [" << e << ", " << e + 8 << ") run past " << r.name << " [" << r.lo
                         << ", " << r.hi << ")";
}

}  // namespace

TEST(TsvdLayout, MmaRegionsAreDisjointAndSized) {
  for (int rp : kMmaRanks) {
    const ck::MmaSmem L = ck::mma_smem(rp);
    EXPECT_EQ(L.x_off, 0);
    EXPECT_EQ(L.a_off - L.x_off, 2 * ck::kBM * ck::kXS) << "rp " << rp;
    EXPECT_EQ(L.b_off - L.a_off, 2 * rp * ck::kAS) << "rp " << rp << ": as is [2][RP][kAS]";
    EXPECT_EQ(L.end - L.b_off, 2 * rp * ck::kBS) << "rp " << rp << ": bs is [2][RP][kBS]";
    EXPECT_EQ(L.a_off % 8, 0);
    EXPECT_EQ(L.b_off % 8, 0);
    EXPECT_EQ(ck::mma_smem_bytes_for(rp), size_t(L.end) * 2);
    // The dynamic bytes plus the kernel's static s_last fit the smallest GPU it runs on (sm_80: 163 KiB).
    EXPECT_LE(ck::mma_smem_bytes_for(rp) + 16, ck::kSmemSm80) << "rp " << rp;
  }
}

TEST(TsvdLayout, MmaLoadsStayInTheirRegionsAndCoverThem) {
  for (int rp : kMmaRanks) {
    const ck::MmaSmem L = ck::mma_smem(rp);
    const Region rx{"xs", L.x_off, L.a_off}, ra{"as", L.a_off, L.b_off}, rb{"bs", L.b_off, L.end};
    std::set<int> written;  // first element of every 16-byte vector written
    auto load = [&](int vectors, int (*elem)(int, int, int), const Region& r, const char* name) {
      for (int buf = 0; buf < 2; ++buf)
        for (int v = 0; v < vectors; ++v) {
          const int e = elem(rp, buf, v);
          expect_vec_in(e, r, std::string(name) + " rp " + std::to_string(rp) + " buf " + std::to_string(buf) + " v " + std::to_string(v));
          EXPECT_TRUE(written.insert(e).second) << name << " rp " << rp << ": two vectors write element " << e;
        }
    };
    load(ck::mma_x_vectors(), [](int r, int b, int v) { return ck::mma_x_elem(r, b, v); }, rx, "X load");
    load(ck::mma_a_vectors(rp), ck::mma_a_elem, ra, "A^T load");
    load(ck::mma_b_vectors(rp), ck::mma_b_elem, rb, "B load");
    // Every payload element of each region is written (rows of kBK / kBN elements, the 8-element pads not).
    EXPECT_EQ(written.size(), size_t(2 * (ck::kBM * ck::kBK + rp * ck::kBK + rp * ck::kBN) / 8)) << "rp " << rp;

    // Every ldmatrix row read is a vector some load wrote, in the region of its operand.
    auto read = [&](int e, const Region& r, const std::string& what) {
      expect_vec_in(e, r, what);
      EXPECT_TRUE(written.count(e)) << what << ": reads element " << e << ", which no load writes";
    };
    for (int buf = 0; buf < 2; ++buf)
      for (int lane = 0; lane < 32; ++lane) {
        for (int ks = 0; ks < ck::kBK / 16; ++ks) {
          for (int warp = 0; warp < ck::kMmaThreads / 32; ++warp)
            read(ck::mma_ldx_elem(rp, buf, warp, ks, lane), rx, "ldmatrix X rp " + std::to_string(rp));
          for (int np = 0; np < rp / 16; ++np) read(ck::mma_lda_elem(rp, buf, np, ks, lane), ra, "ldmatrix A^T rp " + std::to_string(rp));
        }
        for (int kk = 0; kk < rp / 16; ++kk)
          for (int np = 0; np < ck::kBN / 16; ++np) read(ck::mma_ldb_elem(rp, buf, kk, np, lane), rb, "ldmatrix B rp " + std::to_string(rp));
      }
  }
}

TEST(TsvdLayout, WgmmaTmaBoxesFitTheirBuffers) {
  for (const auto& [rp, bn] : kWgShapes) {
    const ck::WgSmem W = ck::wg_smem(rp, bn);
    const std::string what = "rp " + std::to_string(rp) + " bn " + std::to_string(bn);
    // The boxes (tensor maps: 64 elements = 128 bytes inner, `rows` outer; cuda/common/tmap.hpp's encode_tmap).
    const int box_x = 128 * ck::kWgBM, box_a = 128 * rp, box_b = 128 * rp;
    EXPECT_EQ(W.x_bytes, box_x) << what;
    EXPECT_EQ(W.a_bytes, box_a) << what;
    EXPECT_EQ(W.stage, W.x_bytes + W.a_bytes) << what << ": a stage's expect_tx is its two boxes";
    EXPECT_EQ(W.b_block, box_b) << what;
    EXPECT_EQ(W.b_bytes, (bn / 64) * box_b) << what << ": B's expect_tx is bn / 64 boxes";
    // Every TMA destination 1024-aligned (128-byte swizzle) and inside its buffer.
    for (int s = 0; s < ck::kWgStages; ++s) {
      const int x = s * W.stage, a = x + W.x_bytes;
      EXPECT_EQ(x % 1024, 0) << what;
      EXPECT_EQ(a % 1024, 0) << what;
      EXPECT_LE(a + box_a, (s + 1) * W.stage) << what;
      EXPECT_LE((s + 1) * W.stage, W.b_off) << what;
      // The consumers' X descriptors: warpgroup c's 64 rows at c * 64 * 128.
      for (int c = 0; c < 2; ++c) EXPECT_LE(c * 64 * 128 + 64 * 128, W.x_bytes) << what;
    }
    for (int bb = 0; bb < 2; ++bb)
      for (int c = 0; c < bn / 64; ++c) {
        const int dst = W.b_off + bb * W.b_bytes + c * W.b_block;
        EXPECT_EQ(dst % 1024, 0) << what;
        EXPECT_LE(dst + box_b, W.b_off + (bb + 1) * W.b_bytes) << what;
      }
    EXPECT_LE(W.b_off + 2 * W.b_bytes, W.bar_off) << what;
    EXPECT_EQ(W.bar_off % 8, 0) << what;
    EXPECT_EQ(W.bars, 2 * ck::kWgStages + 4) << what;
    // The base is aligned up to 1024 inside the allocation: up to 1008 bytes are lost (the dynamic base is at least
    // 16-aligned).
    EXPECT_LE(W.bar_off + 8 * W.bars + 1008, W.bytes) << what;
    EXPECT_LE(size_t(W.bytes), ck::kSmemSm90) << what;
  }
}

// The bulk-copy gemv's ring (wgmma.cu's tsvd_gemv_bulk): every bulk copy's destination and size a multiple of 16,
// the stages, p, the reduction and the mbarriers disjoint and in order; two CTAs an SM where two stages fit
// kGemvStageBudget, else one; a tile row too large for two stages in an SM gets none (the host then runs the plain
// gemv).
TEST(TsvdLayout, GemvBulkRing) {
  struct T {
    int tk, tn, rp, ctas;  // ctas: 2, 1, or 0 (does not fit)
  };
  for (const T t : {T{128, 128, 32, 2}, T{128, 128, 16, 2}, T{256, 256, 64, 1}, T{256, 256, 32, 2}, T{64, 64, 16, 2},
                    T{128, 512, 48, 1}, T{128, 192, 48, 2}, T{1024, 1024, 256, 0}, T{8, 8, 16, 2}}) {
    const ck::GemvSmem L = ck::gemv_smem(t.tk, t.tn, t.rp);
    const std::string what = "tile " + std::to_string(t.tk) + "x" + std::to_string(t.tn) + " rank " + std::to_string(t.rp);
    if (t.ctas == 0) {
      EXPECT_EQ(L.stages, 0) << what;
      continue;
    }
    EXPECT_EQ(L.ctas_per_sm, t.ctas) << what;
    EXPECT_GE(L.stages, 2) << what;
    EXPECT_LE(L.stages, 8) << what;
    EXPECT_GE(L.x_bytes, t.tk * 2) << what;
    for (int v : {L.x_bytes, L.a_bytes, L.b_bytes, L.stage, L.p_off, L.red_off}) EXPECT_EQ(v % 16, 0) << what;
    EXPECT_EQ(L.a_bytes, t.rp * t.tk * 2) << what;
    EXPECT_EQ(L.b_bytes, t.rp * t.tn * 2) << what;
    EXPECT_EQ(L.stage, L.x_bytes + L.a_bytes + L.b_bytes) << what;
    EXPECT_LE(L.stages * L.stage, L.p_off) << what;
    EXPECT_LE(L.p_off + t.rp * 4, L.red_off) << what;
    EXPECT_EQ(L.bar_off, L.red_off + ck::kGemvThreads * 32) << what;  // (256 / (tn / 8)) x tn floats at most
    EXPECT_EQ(L.bar_off % 8, 0) << what;
    EXPECT_EQ(L.bytes, L.bar_off + 8 * L.stages) << what;
    // What an SM holds: ctas_per_sm CTAs, each with 1 KiB the driver reserves.
    EXPECT_LE(size_t(L.ctas_per_sm) * size_t(L.bytes + 1024), ck::kSmemSm90 + 1024) << what;
    if (L.ctas_per_sm == 2) EXPECT_LE(L.bytes, ck::kGemvStageBudget) << what;
  }
}
