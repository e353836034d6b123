// dist/plan.cpp — shard layouts and the distributed plan (spattn/distributed.hpp): per rank, the keys its rows
// reach on other ranks (plan/key_reach.hpp), the global rows it answers for others, and the bytes exchanged.
#include <iomanip>
#include <sstream>

#include "dist/ranges.hpp"
#include "plan/key_reach.hpp"
#include "spattn/distributed.hpp"

namespace spattn::dist {

namespace {

void check_world(int64_t len, int world, int64_t chunks_per_rank, const char* layout) {
  std::ostringstream s;
  if (world < 1) {
    s << layout << " layout: world size W = " << world << " must be >= 1";
    throw Error(s.str());
  }
  if (int64_t(world) * chunks_per_rank > len) {
    s << layout << " layout: world size W = " << world << " needs L >= " << int64_t(world) * chunks_per_rank
      << " tokens (" << chunks_per_rank << " chunk(s) a rank), L = " << len;
    throw Error(s.str());
  }
}

std::string ranges_str(const IndexRanges& r) { return r.empty() ? "-" : ranges_text(r, 6); }

IndexRanges concat(const std::vector<IndexRanges>& parts) {
  IndexRanges out;
  for (const IndexRanges& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// The rows of the patterns' global_rows terms (which keep every key), as ranges.
IndexRanges rows_of_row_terms(const std::vector<BoundPattern>& patterns) {
  IndexRanges out;
  for (const BoundPattern& p : patterns)
    for (const BoundPattern& t : p.union_terms()) {
      if (t.shape() != BoundPattern::Shape::rows) continue;
      for (int64_t q = 0; q < t.q_len(); ++q) {
        if (t.row_nnz(q) == 0) continue;
        if (!out.empty() && out.back().end == q)
          ++out.back().end;
        else
          out.push_back({q, q + 1});
      }
    }
  return detail::normalized(out);
}

}  // namespace

ShardLayout ShardLayout::contiguous(int64_t len, int world) {
  check_world(len, world, 1, "contiguous");
  ShardLayout s{len, {}};
  for (int r = 0; r < world; ++r) s.owned.push_back({{len * r / world, len * (r + 1) / world}});
  return s;
}

ShardLayout ShardLayout::zigzag(int64_t len, int world) {
  check_world(len, world, 2, "zigzag");
  const int64_t n = 2 * int64_t(world);
  auto chunk = [&](int64_t c) { return IndexRange{len * c / n, len * (c + 1) / n}; };
  ShardLayout s{len, {}};
  for (int r = 0; r < world; ++r) s.owned.push_back({chunk(r), chunk(n - 1 - r)});
  return s;
}

ShardLayout ShardLayout::from_ranges(int64_t len, std::vector<IndexRanges> owned) {
  if (owned.empty()) throw Error("shard layout: world size W = 0 must be >= 1");
  if (len < 1) throw Error("shard layout: sequence length L = " + std::to_string(len) + " must be >= 1");
  std::vector<std::pair<IndexRange, int>> all;
  for (size_t r = 0; r < owned.size(); ++r)
    for (const IndexRange& x : owned[r]) {
      if (x.begin < 0 || x.end < x.begin || x.end > len)
        throw Error("shard layout: rank " + std::to_string(r) + " range [" + std::to_string(x.begin) + ", " +
                    std::to_string(x.end) + ") is not a range inside [0, " + std::to_string(len) + ")");
      if (x.size() > 0) all.push_back({x, int(r)});
    }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first.begin < b.first.begin; });
  int64_t next = 0;
  for (const auto& [x, r] : all) {
    if (x.begin > next)
      throw Error("shard layout: tokens [" + std::to_string(next) + ", " + std::to_string(x.begin) +
                  ") belong to no rank");
    if (x.begin < next)
      throw Error("shard layout: token " + std::to_string(x.begin) + " belongs to two ranges (rank " +
                  std::to_string(r) + "'s [" + std::to_string(x.begin) + ", " + std::to_string(x.end) + ") and another)");
    next = x.end;
  }
  if (next != len)
    throw Error("shard layout: tokens [" + std::to_string(next) + ", " + std::to_string(len) + ") belong to no rank");
  return ShardLayout{len, std::move(owned)};
}

ShardLayout ShardLayout::parse(std::string_view name, int64_t len, int world) {
  if (name == "contiguous") return contiguous(len, world);
  if (name == "zigzag") return zigzag(len, world);
  throw Error("shard layout '" + std::string(name) + "': expected contiguous or zigzag");
}

DistPlan::DistPlan(const std::vector<Pattern>& patterns, const Problem& problem, ShardLayout layout,
                   DistOptions options)
    : problem_(problem), layout_(std::move(layout)), options_(options) {
  problem.validate();
  if (problem.q_len != problem.kv_len)
    throw Error("distributed plan: self-attention only, q_len " + std::to_string(problem.q_len) + " != kv_len " +
                std::to_string(problem.kv_len));
  layout_ = ShardLayout::from_ranges(layout_.len, std::move(layout_.owned));  // validated (W >= 1, coverage)
  if (layout_.len != problem.q_len)
    throw Error("distributed plan: the shard layout covers L = " + std::to_string(layout_.len) + " tokens, the problem " +
                std::to_string(problem.q_len));
  if (options_.key_block < 1)
    throw Error("distributed plan: key_block = " + std::to_string(options_.key_block) + " must be >= 1");
  if (patterns.empty() || (patterns.size() != 1 && int64_t(patterns.size()) != problem.q_heads))
    throw Error("distributed plan: expected 1 pattern or one per query head (" + std::to_string(problem.q_heads) +
                "), got " + std::to_string(patterns.size()));
  std::vector<BoundPattern> distinct;
  for (const Pattern& p : patterns) {
    patterns_.push_back(p.bind(problem.q_len, problem.kv_len));
    bool seen = false;
    for (const BoundPattern& d : distinct) seen = seen || d.spec() == p.spec();
    if (!seen) distinct.push_back(patterns_.back());
  }
  const int W = world();
  const int64_t L = problem.q_len;
  const IndexRanges global_rows = options_.distribute_rows && W > 1 ? rows_of_row_terms(distinct) : IndexRanges{};
  std::vector<IndexRanges> sorted(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) sorted[size_t(r)] = detail::normalized(layout_.owned[size_t(r)]);
  const int64_t B = problem.batch, Hq = problem.q_heads;
  const int64_t part_bytes = B * Hq * (problem.dv() + 1) * 4;  // one row's partial result: o and lse in fp32
  ranks_.resize(size_t(W));
  for (int r = 0; r < W; ++r) {
    RankPlan& rp = ranks_[size_t(r)];
    const IndexRanges& own = sorted[size_t(r)];
    rp.rank = r;
    rp.owned = layout_.owned[size_t(r)];
    rp.skipped = detail::intersect(global_rows, own);
    const IndexRanges need =
        detail::subtract(plan::keys_reached(distinct, detail::subtract(own, rp.skipped)), own);
    rp.boundary_keys = total_size(need);
    IndexRanges fetch = need;
    if (options_.key_block > 1) {
      const int64_t kb = options_.key_block;
      for (IndexRange& x : fetch) x = {x.begin / kb * kb, std::min(L, (x.end + kb - 1) / kb * kb)};
      fetch = detail::subtract(detail::normalized(fetch), own);
    }
    rp.recv_keys.assign(size_t(W), {});
    rp.send_keys.assign(size_t(W), {});
    rp.recv_rows.assign(size_t(W), {});
    rp.send_rows.assign(size_t(W), {});
    for (int s = 0; s < W; ++s) {
      if (s == r) continue;
      rp.recv_keys[size_t(s)] = detail::intersect(fetch, sorted[size_t(s)]);
      rp.recv_rows[size_t(s)] = detail::intersect(global_rows, sorted[size_t(s)]);
      rp.send_rows[size_t(s)] = rp.skipped;
    }
    rp.fetched = concat(rp.recv_keys);
    rp.row_queries = concat(rp.recv_rows);
    rp.fetched_keys = total_size(rp.fetched);
  }
  for (int r = 0; r < W; ++r) {
    RankPlan& rp = ranks_[size_t(r)];
    for (int s = 0; s < W; ++s) rp.send_keys[size_t(s)] = ranks_[size_t(s)].recv_keys[size_t(r)];
    const int64_t own_rows_out = total_size(rp.skipped) * (W - 1);  // its global rows, to every peer
    const int64_t rows_in = total_size(rp.row_queries);
    rp.kv_recv_bytes = rp.fetched_keys * kv_token_bytes();
    rp.boundary_bytes = rp.boundary_keys * kv_token_bytes();
    rp.recv_bytes = rp.kv_recv_bytes + rows_in * q_token_bytes() + own_rows_out * part_bytes;
    rp.send_bytes = total_size(concat(rp.send_keys)) * kv_token_bytes() + own_rows_out * q_token_bytes() +
                    rows_in * part_bytes;
    const BoundPattern& p0 = patterns_[0];
    rp.nnz_local = BoundPattern::window(p0, rp.owned, rp.owned).nnz();
    rp.nnz_remote = rp.fetched.empty() ? 0 : BoundPattern::window(p0, rp.owned, rp.fetched, rp.skipped).nnz();
    rp.nnz_rows = rp.row_queries.empty() ? 0 : BoundPattern::window(p0, rp.row_queries, rp.owned).nnz();
  }
}

const RankPlan& DistPlan::rank(int r) const {
  if (r < 0 || r >= world())
    throw Error("rank " + std::to_string(r) + " is not in [0, " + std::to_string(world()) + ")");
  return ranks_[size_t(r)];
}

int64_t DistPlan::kv_token_bytes() const {
  return problem_.batch * problem_.kv_heads * (problem_.head_dim + problem_.dv()) * dtype_size(problem_.dtype);
}
int64_t DistPlan::q_token_bytes() const {
  return problem_.batch * problem_.q_heads * problem_.head_dim * dtype_size(problem_.dtype);
}

std::string DistPlan::explain() const {
  std::ostringstream s;
  const Problem& p = problem_;
  s << "distributed plan: '" << patterns_[0].spec() << "'" << (patterns_.size() > 1 ? " (and per-head patterns)" : "")
    << ", L = " << p.q_len << ", W = " << world() << ", B = " << p.batch << ", Hq = " << p.q_heads
    << ", Hkv = " << p.kv_heads << ", D = " << p.head_dim << ", Dv = " << p.dv() << ", " << dtype_name(p.dtype)
    << "; key block " << options_.key_block << "; one token's K+V " << kv_token_bytes() << " bytes\n";
  int64_t nnz_max = 0, nnz_sum = 0, recv = 0, boundary = 0;
  for (const RankPlan& r : ranks_) {
    const int64_t nnz = r.nnz_local + r.nnz_remote + r.nnz_rows;
    nnz_max = std::max(nnz_max, nnz);
    nnz_sum += nnz;
    recv += r.kv_recv_bytes;
    boundary += r.boundary_bytes;
    s << "  rank " << r.rank << ": tokens " << ranges_str(r.owned) << " (" << total_size(r.owned) << "); scores local "
      << r.nnz_local << ", remote " << r.nnz_remote << ", rows " << r.nnz_rows << "\n";
    for (int src = 0; src < world(); ++src)
      if (!r.recv_keys[size_t(src)].empty())
        s << "    fetches from rank " << src << ": keys " << ranges_str(r.recv_keys[size_t(src)]) << " ("
          << total_size(r.recv_keys[size_t(src)]) << ")\n";
    if (!r.skipped.empty()) s << "    its global rows " << ranges_str(r.skipped) << ": queries to every rank, partials back\n";
    if (!r.row_queries.empty()) s << "    answers global rows " << ranges_str(r.row_queries) << " over its keys\n";
    s << "    K/V received " << r.kv_recv_bytes << " bytes; boundary volume " << r.boundary_bytes << " bytes ("
      << r.boundary_keys << " keys)";
    if (r.boundary_bytes > 0) s << ", ratio " << std::fixed << std::setprecision(3) << double(r.kv_recv_bytes) / double(r.boundary_bytes) << std::defaultfloat;
    s << "; all messages: received " << r.recv_bytes << ", sent " << r.send_bytes << " bytes\n";
  }
  s << "  total K/V exchanged " << recv << " bytes, boundary volume " << boundary << " bytes; scores per rank max "
    << nnz_max << ", mean " << (world() ? nnz_sum / world() : 0) << " (balance "
    << std::fixed << std::setprecision(3) << (nnz_max ? double(nnz_sum) / double(world()) / double(nnz_max) : 1.0) << ")";
  return s.str();
}

}  // namespace spattn::dist
