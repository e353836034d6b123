// pattern/terms.cpp — a bound pattern's union terms (BoundPattern::union_terms), their union and their shape: what
// the planner's split (plan/parts.hpp) reads of the spec; and a blocked spec's inner pattern (BoundPattern::blocked).
#include <algorithm>
#include <numeric>
#include <string>

#include "pattern/ast.hpp"

namespace spattn {
namespace {

using detail::Kind;
using detail::Node;
using NodePtr = std::shared_ptr<const Node>;

std::string list(const detail::IndexSet& set) {
  std::string s;
  for (auto& [a, b] : set) {
    if (!s.empty()) s += ", ";
    s += b - a == 1 ? std::to_string(a) : std::to_string(a) + ":" + std::to_string(b);
  }
  return s;
}

std::string tuple(const std::array<int64_t, 3>& v, int n) {
  std::string s = "(";
  for (int i = 0; i < n; ++i) {
    if (i) s += ',';
    s += std::to_string(v[size_t(i)]);
  }
  return s + ")";
}

// The canonical spec of a node (presets expanded), for explain and for the terms' spec().
std::string spec_of(const Node& n) {
  auto join = [&](const char* op) {
    std::string s;
    for (auto& c : n.children) {
      const bool paren = c->kind == Kind::Union || (c->kind == Kind::Inter && n.kind == Kind::Inter);
      if (!s.empty()) s += op;
      if (paren) s += '(';
      s += spec_of(*c);
      if (paren) s += ')';
    }
    return s;
  };
  const auto a = std::to_string(n.a), b = std::to_string(n.b);
  switch (n.kind) {
    case Kind::Union: return join(" | ");
    case Kind::Inter: return join(" & ");
    case Kind::Dense: return "dense";
    case Kind::Causal: return "causal";
    case Kind::Local: return n.a == n.b ? "local(" + a + ")" : "local(left=" + a + ", right=" + b + ")";
    case Kind::Dilated: return "dilated(" + a + ", " + b + ")";
    case Kind::Stride: return "stride(" + a + ")";
    case Kind::BlockDiag: return "block_diag(" + a + ")";
    case Kind::Summary: return "summary(" + a + ", c=" + b + ")";
    case Kind::Global: return "global(" + list(n.set) + ")";
    case Kind::GlobalRows: return "global_rows(" + list(n.set) + ")";
    case Kind::GlobalCols: return "global_cols(" + list(n.set) + ")";
    case Kind::Random: return "random(" + a + ", seed=" + b + ")";
    case Kind::Document: {
      std::string s = "document(";
      for (size_t i = 0; i < n.segments.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(n.segments[i]);
      }
      return s + ")";
    }
    case Kind::Blocked: return "blocked(" + a + ", " + spec_of(*n.children[0]) + ")";
    case Kind::Neighborhood: {
      std::string s = "neighborhood(";
      if (n.dims[0]) s += "dims=" + tuple(n.dims, n.naxes) + ", ";
      s += "kernel=" + tuple(n.kernel, n.naxes) + ", dilation=" + tuple(n.dilation, n.naxes) + ", causal=(";
      for (int i = 0; i < n.naxes; ++i) {
        if (i) s += ',';
        s += n.causal[size_t(i)] ? '1' : '0';
      }
      return s + "))";
    }
  }
  return "?";
}

// The top-level union's operands, flattened; global(G) as global_rows(G) | global_cols(G), each clipped to its
// axis (the whole was validated against the larger length).
void flatten(const NodePtr& n, std::vector<NodePtr>& out) {
  if (n->kind == Kind::Union) {
    for (auto& c : n->children) flatten(c, out);
    return;
  }
  if (n->kind == Kind::Global) {
    for (Kind k : {Kind::GlobalRows, Kind::GlobalCols}) {
      auto half = std::make_shared<Node>(*n);
      half->kind = k;
      half->clip = true;
      out.push_back(half);
    }
    return;
  }
  out.push_back(n);
}

// The neighborhood atoms of a spec (not inside blocked: its atoms see blocks, not tokens).
void neighborhood_atoms(const Node& n, std::vector<const Node*>& out) {
  if (n.kind == Kind::Neighborhood) out.push_back(&n);
  if (n.kind == Kind::Blocked) return;
  for (auto& c : n.children) neighborhood_atoms(*c, out);
}

bool has_random(const Node& n) {
  if (n.kind == Kind::Random) return true;
  if (n.kind == Kind::Blocked) return false;  // random blocks cluster
  for (auto& c : n.children)
    if (has_random(*c)) return true;
  return false;
}

}  // namespace

std::vector<BoundPattern> BoundPattern::union_terms() const {
  if (!node_) return {*this};
  std::vector<NodePtr> nodes;
  flatten(node_, nodes);
  if (nodes.size() == 1 && nodes[0] == node_) return {*this};
  std::vector<BoundPattern> terms;
  for (auto& n : nodes) terms.push_back(of_node(n, q_len_, k_len_));
  return terms;
}

BoundPattern BoundPattern::of_node(std::shared_ptr<const detail::Node> node, int64_t q_len, int64_t k_len) {
  BoundPattern b;
  b.spec_ = spec_of(*node);
  b.q_len_ = q_len;
  b.k_len_ = k_len;
  b.node_ = std::move(node);
  b.root_ = detail::bind_node(b.node_, b.spec_, q_len, k_len);
  return b;
}

BoundPattern BoundPattern::union_of(const std::vector<BoundPattern>& terms) {
  if (terms.empty()) throw Error("union_of: no terms");
  if (terms.size() == 1) return terms[0];
  auto u = std::make_shared<Node>();
  u->kind = Kind::Union;
  for (auto& t : terms) {
    if (!t.node_) throw Error("union_of: '" + t.spec_ + "' is an explicit pattern (no spec to unite)");
    if (t.q_len_ != terms[0].q_len_ || t.k_len_ != terms[0].k_len_)
      throw Error("union_of: '" + t.spec_ + "' is bound to " + std::to_string(t.q_len_) + " x " + std::to_string(t.k_len_) +
                  ", '" + terms[0].spec_ + "' to " + std::to_string(terms[0].q_len_) + " x " + std::to_string(terms[0].k_len_));
    u->children.push_back(t.node_);
  }
  return of_node(u, terms[0].q_len_, terms[0].k_len_);
}

BoundPattern BoundPattern::dilated_offsets(int64_t q_len, int64_t k_len, int64_t d, int64_t lo, int64_t hi) {
  if (d < 2 || lo > hi || q_len < 0 || k_len < 0)
    throw Error("dilated_offsets: need d >= 2 and lo <= hi, got d " + std::to_string(d) + ", lo " + std::to_string(lo) +
                ", hi " + std::to_string(hi));
  // Offsets past every row's reach bind nothing: clamped so that m d fits.
  lo = std::max(lo, -(q_len / d + 1)), hi = std::min(hi, k_len / d + 1);
  auto st = std::make_shared<Node>();
  st->kind = Kind::Stride;
  st->a = d;
  auto band = std::make_shared<Node>();
  band->kind = Kind::Local;
  band->a = -lo * d;
  band->b = hi * d;
  auto inter = std::make_shared<Node>();
  inter->kind = Kind::Inter;
  inter->children = {st, band};
  return of_node(inter, q_len, k_len);
}

std::optional<BoundPattern::Blocked> BoundPattern::blocked() const {
  if (!root_ || !node_ || node_->kind != Kind::Blocked) return std::nullopt;
  Blocked out{1, {}};
  out.inner.root_ = root_->blocked(out.block);
  out.inner.node_ = node_->children[0];
  out.inner.spec_ = spec_of(*out.inner.node_);
  out.inner.q_len_ = out.inner.root_->q_len;
  out.inner.k_len_ = out.inner.root_->k_len;
  return out;
}

std::optional<BoundPattern::RandomSpec> BoundPattern::random_spec() const {
  if (!root_ || !node_ || node_->kind != Kind::Random) return std::nullopt;
  return RandomSpec{node_->a, uint64_t(node_->b)};
}

BoundPattern::Shape BoundPattern::shape() const {
  if (!node_) return Shape::general;
  switch (node_->kind) {
    case Kind::GlobalCols:
    case Kind::Summary: return Shape::columns;
    case Kind::GlobalRows: return Shape::rows;
    default: return has_random(*node_) ? Shape::scattered : Shape::general;
  }
}

std::optional<NeighborhoodGrid> BoundPattern::neighborhood_grid() const {
  if (!node_) return std::nullopt;
  std::vector<const Node*> atoms;
  neighborhood_atoms(*node_, atoms);
  if (atoms.empty()) return std::nullopt;
  NeighborhoodGrid g;
  const Node& first = *atoms[0];
  g.naxes = first.naxes;
  g.exact = atoms.size() == 1 && node_.get() == &first;
  for (int ax = 0; ax < g.naxes; ++ax) {
    const size_t a = size_t(ax);
    g.dims[a] = first.dims[a] ? first.dims[a] : q_len_;  // dims omitted (1-D): the length (bind checked it)
    g.dilation[a] = g.atom_dilation[a] = first.dilation[a];
    g.kernel[a] = first.kernel[a];
    g.causal[a] = first.causal[a];
  }
  for (const Node* n : atoms) {
    if (n->naxes != g.naxes) return std::nullopt;
    for (size_t a = 0; a < size_t(g.naxes); ++a) {
      if ((n->dims[a] ? n->dims[a] : q_len_) != g.dims[a]) return std::nullopt;
      g.dilation[a] = std::gcd(g.dilation[a], n->dilation[a]);
    }
  }
  return g;
}

Run NeighborhoodGrid::window(int axis, int64_t i) const {
  if (axis < 0 || axis >= naxes || i < 0 || i >= dims[size_t(axis)])
    throw Error("neighborhood grid: coordinate " + std::to_string(i) + " on axis " + std::to_string(axis) +
                " is outside the grid");
  const size_t a = size_t(axis);
  return detail::neighborhood_window(dims[a], kernel[a], atom_dilation[a], causal[a], i);
}

}  // namespace spattn
