// tests/launch_decision_cases.hpp — the cases of launch_decision_test.cpp and how a GPU launch decision is written as text
// (one line a case): the tile plan (shape, counts and a hash of its arrays), the kernel-table row, the band kernel's
// split for a few batch x head counts on a 132-SM device, and the backward's row. The golden file
// (tests/golden/launch_decisions.txt) was written by this text from the planner before the decision moved into
// src/plan/gpu (issue 43): the move changed no decision.
#pragma once
#include <cstdint>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "plan/kernels.hpp"

namespace decision_test {

struct Case {
  std::string spec;
  int64_t len;
  int64_t head_dim;
  int cc;              // 80 or 90 (sm_90a)
  std::string kernel;  // PlanOptions::kernel ("" chosen)
  int tile_map = -1;
  int block_m = 0, block_n = 0;
  int compound = -1;
};

inline std::string name(const Case& c) {
  std::ostringstream s;
  s << c.spec << " L=" << c.len << " D=" << c.head_dim << " cc=" << c.cc << " kernel=" << (c.kernel.empty() ? "-" : c.kernel)
    << " tile_map=" << c.tile_map << " block=" << c.block_m << "x" << c.block_n << " compound=" << c.compound;
  return s.str();
}

// The suite of bench/ab.py at L=4096 and a few more shapes, both head dims, both devices; every forced kind and a few
// forced rows on the sm_90a device.
inline std::vector<Case> cases() {
  const std::vector<std::pair<std::string, int64_t>> patterns = {
      {"local(256)", 4096}, {"longformer(256, 32)", 4096}, {"bigbird(64, 1, 2, 3, seed=0)", 4096},
      {"dilated(256, 2)", 4096}, {"dilated(100, 3)", 4096}, {"causal", 4096}, {"causal", 16384}, {"dense", 4096},
      {"sparse_fixed(128)", 4096}, {"random(205, seed=0)", 4096}, {"random(120, seed=5)", 1000},
      {"neighborhood(dims=(64,64), kernel=13)", 4096}, {"neighborhood(dims=(64,64), kernel=7, dilation=2)", 4096},
      {"neighborhood(dims=(4,32,32), kernel=7, causal=(1,0,0))", 4096}, {"neighborhood(kernel=257)", 4096},
      {"local(256) | global_cols(0:32)", 4096}, {"local(left=1024, right=0) | global_cols(0:4)", 4096},
      {"local(200) | global_rows(0:64)", 4096}, {"local(256) | random(4)", 4096}, {"local(16)", 4096},
      {"local(left=200, right=0)", 4096}, {"global(0:32) | random(300)", 4096}, {"dilated(128, 3) | random(30)", 4096},
      {"document(700, 1500, 1899) & causal", 4099}, {"blocked(64, causal) | local(1)", 4096}, {"block_diag(128)", 4096},
      {"local(1024)", 16384}};
  const std::vector<std::string> kinds = {"", "sm80", "sm90_cp", "sm90_tma", "sm90_band", "sm90_band_rmax"};
  std::vector<Case> out;
  for (const auto& [spec, len] : patterns)
    for (int64_t d : {64, 128})
      for (int cc : {80, 90})
        for (const std::string& k : kinds) {
          if (cc == 80 && k != "" && k != "sm80" && k != "sm90_tma") continue;
          out.push_back({spec, len, d, cc, k});
        }
  // Forced rows and shapes, tile maps, no compound split.
  for (const char* spec : {"local(256)", "dilated(256, 2)", "random(205, seed=0)", "bigbird(64, 1, 2, 3, seed=0)"})
    for (const char* row : {"sm90_tma_128x128_d64", "sm90_tma_192x128_d64", "sm90_cp_64x64_d64", "sm80_64x128_d64",
                            "sm90_band_d64", "sm90_tma_128x128_d128", "sm90_cp_64x64_d128"})
      out.push_back({spec, 4096, std::string(row).ends_with("d128") ? 128 : 64, 90, row});
  for (const char* spec : {"local(256)", "dilated(256, 2)", "sparse_fixed(128)", "causal"})
    for (int d : {64, 128}) {
      out.push_back({spec, 4096, d, 90, "", -1, 64, 64});
      out.push_back({spec, 4096, d, 90, "", -1, 128, 128});
      out.push_back({spec, 4096, d, 90, "sm90_tma", -1, 64, 128});
    }
  for (const char* spec : {"neighborhood(dims=(64,64), kernel=13)", "neighborhood(dims=(64,64), kernel=7, dilation=2)"})
    for (int d : {64, 128})
      for (int tm : {0, 1, 2}) out.push_back({spec, 4096, d, 90, "", tm});
  for (const char* spec : {"sparse_fixed(128)", "local(200) | global_rows(0:64)", "local(256) | random(4)",
                           "global(0:32) | random(300)"})
    for (int mode : {0, 1}) out.push_back({spec, 4096, 64, 90, "", -1, 0, 0, mode});
  return out;
}

// FNV-1a over the words of a plan's arrays.
struct Hash {
  uint64_t h = 1469598103934665603ull;
  template <class T>
  void add(const T* p, size_t n) {
    const auto* b = reinterpret_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n * sizeof(T); ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  template <class V>
  void add(const V& v) {
    add(v.data(), v.size());
  }
};

// One tile list's decision: its plan, its row, the band kernel's split (first item split, parts, slabs) at
// batch x heads of 1, 4 and 32 on 132 SMs. `split_of(bh)` gives the three numbers.
template <class Plan, class SplitOf>
std::string tiles_text(const Plan& p, int row, SplitOf split_of) {
  std::ostringstream s;
  s << "row " << (row >= 0 ? spattn::plan::kKernels[row].name : "none") << " tiles " << p.block_m << "x" << p.block_n
    << " perm " << p.perm_d << " groups " << p.q_group << "/" << p.k_group << " tiles " << p.q_tiles << "/" << p.k_tiles
    << (p.mapped() ? " mapped" : "") << (p.key_strips() ? " strips" : "");
  if (p.band)
    s << " band " << p.band_lo << ".." << p.band_hi << (p.band_shifted ? " shifted" : "") << " prefix " << p.band_prefix;
  s << " entries " << p.nentries() << " full " << p.n_full << " band " << p.n_band << " bitmask " << p.n_bitmask << " nnz "
    << p.nnz << " drawn " << p.drawn.r << " windows " << p.grid_windows.size();
  Hash h;
  h.add(p.row_offsets);
  h.add(p.entries);
  if (!p.masks_drawn()) h.add(p.masks);
  h.add(p.order);
  h.add(p.q_map);
  h.add(p.k_map);
  h.add(p.strips);
  h.add(p.grid_windows);
  s << " hash " << std::hex << h.h << std::dec;
  if (row >= 0 && spattn::plan::is_band(spattn::plan::kKernels[row].kind))
    for (int bh : {1, 4, 32}) {
      const auto [first, k, slabs] = split_of(bh);
      s << " split" << bh << " " << first << "," << k << "," << slabs;
    }
  return s.str();
}

}  // namespace decision_test
