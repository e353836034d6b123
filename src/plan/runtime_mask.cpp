// plan/runtime_mask.cpp — run-time masks on the host (plan/runtime_mask.hpp) and the public records' helpers
// (spattn/runtime_mask.hpp).
#include "plan/runtime_mask.hpp"

#include <algorithm>
#include <cstring>
#include <sstream>

namespace spattn {

IndexView IndexView::make(const void* data, int bits, std::initializer_list<int64_t> shape) {
  if (shape.size() < 1 || shape.size() > 4)
    throw Error("an index tensor has 1 to 4 dimensions, got " + std::to_string(shape.size()));
  IndexView v;
  v.data = data;
  v.bits = bits;
  v.ndim = int32_t(shape.size());
  std::copy(shape.begin(), shape.end(), v.shape.begin());
  int64_t s = 1;
  for (int i = v.ndim - 1; i >= 0; --i) {
    v.stride[size_t(i)] = s;
    s *= v.shape[size_t(i)];
  }
  return v;
}

std::string IndexView::shape_text() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[size_t(i)]);
  return s + "]";
}

IndexView& RuntimeMask::slot(int i) {
  switch (i) {
    case 0: return kv_num_blocks;
    case 1: return kv_indices;
    case 2: return full_kv_num_blocks;
    case 3: return full_kv_indices;
    case 4: return cu_seqlens_q;
    case 5: return cu_seqlens_k;
    case 6: return topk_indices;
  }
  throw Error("run-time mask slot " + std::to_string(i) + ": expected 0 to " + std::to_string(kSlots - 1));
}

namespace {
int64_t parse_count(std::string_view text, std::string_view what, std::string_view whole) {
  int64_t v = 0;
  if (text.empty() || text.size() > 12) throw Error("mask '" + std::string(whole) + "': " + std::string(what) + " '" + std::string(text) + "' is not a count");
  for (char c : text) {
    if (c < '0' || c > '9') throw Error("mask '" + std::string(whole) + "': " + std::string(what) + " '" + std::string(text) + "' is not a count");
    v = v * 10 + (c - '0');
  }
  return v;
}
}  // namespace

MaskLayout MaskLayout::parse(std::string_view text) {
  const size_t c1 = text.find(':');
  const std::string_view kind = text.substr(0, c1);
  std::string_view rest = c1 == std::string_view::npos ? std::string_view() : text.substr(c1 + 1);
  auto take = [&] {  // the next ':'-separated field
    const size_t c = rest.find(':');
    std::string_view f = rest.substr(0, c);
    rest = c == std::string_view::npos ? std::string_view() : rest.substr(c + 1);
    return f;
  };
  MaskLayout m;
  if (kind == "blocks") {
    const std::string_view sizes = take();
    const size_t x = sizes.find('x');
    if (x == std::string_view::npos)
      throw Error("mask '" + std::string(text) + "': expected blocks:QBxKB[:SPEC] (e.g. blocks:128x128:causal)");
    m = blocks(parse_count(sizes.substr(0, x), "query block", text), parse_count(sizes.substr(x + 1), "key block", text));
  } else if (kind == "documents") {
    m = documents();
  } else if (kind == "topk") {
    m = topk_keys(parse_count(take(), "K", text));
  } else {
    throw Error("mask '" + std::string(text) + "': expected blocks:QBxKB[:SPEC], documents[:SPEC] or topk:K[:SPEC]");
  }
  m.spec = std::string(rest);
  return m;
}

std::string MaskLayout::str() const {
  std::string s = kind == MaskKind::blocks      ? "blocks:" + std::to_string(q_block) + "x" + std::to_string(k_block)
                  : kind == MaskKind::documents ? std::string("documents")
                                                : "topk:" + std::to_string(topk);
  return spec.empty() ? s : s + ":" + spec;
}

void MaskLayout::validate(const Problem& problem) const {
  if (kind == MaskKind::blocks && (q_block < 1 || k_block < 1))
    throw Error("mask " + str() + ": block sizes must be >= 1, got " + std::to_string(q_block) + " x " + std::to_string(k_block));
  if (kind == MaskKind::topk && topk < 1) throw Error("mask " + str() + ": K must be >= 1, got " + std::to_string(topk));
  if (problem.q_len >= (int64_t(1) << 31) || problem.kv_len >= (int64_t(1) << 31))
    throw Error("run-time masks take lengths below 2^31, got " + std::to_string(problem.q_len) + " x " +
                std::to_string(problem.kv_len));
  if (!spec.empty()) {
    const Pattern p = spattn::parse(spec);
    if (kind != MaskKind::documents) p.bind(problem.q_len, problem.kv_len);
  }
}

}  // namespace spattn

namespace spattn::plan {
namespace {

std::string dims_text(std::initializer_list<int64_t> d) {
  std::string s = "[";
  int i = 0;
  for (int64_t x : d) s += (i++ ? ", " : "") + std::to_string(x);
  return s + "]";
}

// The tensor in `slot` as contiguous int64 (its logical shape), after its rank and element width are checked (copy
// false: only checked, the vector left empty).
std::vector<int64_t> read(const IndexView& t, const char* name, int ndim, bool on_device, int device, Stream stream,
                          bool copy = true) {
  if (t.bits != 32 && t.bits != 64)
    throw Error(std::string(name) + " has " + std::to_string(t.bits) + "-bit elements, expected int32 or int64");
  if (t.ndim != ndim)
    throw Error(std::string(name) + " has " + std::to_string(t.ndim) + " dimensions " + t.shape_text() + ", expected " +
                std::to_string(ndim));
  int64_t n = 1, extent = 1;  // elements, and the span of memory they lie in
  for (int i = 0; i < ndim; ++i) {
    const int64_t s = t.shape[size_t(i)], st = t.stride[size_t(i)];
    if (s < 0 || st < 0) throw Error(std::string(name) + ": negative size or stride in dimension " + std::to_string(i));
    n *= s;
    if (s > 0) extent += (s - 1) * st;
  }
  if (!copy) return {};
  std::vector<int64_t> out(static_cast<size_t>(n));
  if (n == 0) return out;
  const int64_t esize = t.bits / 8;
  std::vector<char> staged;
  const char* base = static_cast<const char*>(t.data);
  if (on_device) {
    staged.resize(size_t(extent * esize));
    device_to_host(staged.data(), t.data, extent * esize, device, stream);
    base = staged.data();
  }
  std::array<int64_t, 4> idx{0, 0, 0, 0};
  for (int64_t e = 0; e < n; ++e) {
    int64_t off = 0;
    for (int i = 0; i < ndim; ++i) off += idx[size_t(i)] * t.stride[size_t(i)];
    if (esize == 4) {
      int32_t x;
      std::memcpy(&x, base + off * 4, 4);
      out[size_t(e)] = x;
    } else {
      std::memcpy(&out[size_t(e)], base + off * 8, 8);
    }
    for (int i = ndim - 1; i >= 0; --i) {
      if (++idx[size_t(i)] < t.shape[size_t(i)]) break;
      idx[size_t(i)] = 0;
    }
  }
  return out;
}

void refuse_others(const RuntimeMask& mask, std::initializer_list<int> allowed, const MaskLayout& layout) {
  for (int i = 0; i < RuntimeMask::kSlots; ++i) {
    if (!mask.slot(i).present()) continue;
    if (std::find(allowed.begin(), allowed.end(), i) == allowed.end())
      throw Error(std::string(RuntimeMask::kSlotNames[size_t(i)]) + " was given to a plan for mask " + layout.str() +
                  ", which does not read it");
  }
}

void need(const IndexView& t, const char* name, const MaskLayout& layout) {
  if (!t.present()) throw Error("mask " + layout.str() + " needs " + name);
}

// A batch / head dimension that is the problem's or 1 (broadcast).
void broadcast_dim(int64_t got, int64_t want, const char* name, int dim, const char* what) {
  if (got != want && got != 1)
    throw Error(std::string(name) + " has " + std::to_string(got) + " in dimension " + std::to_string(dim) + " (" +
                what + "), expected " + std::to_string(want) + " or 1");
}

void load_blocks(HostMask& m, const RuntimeMask& mask, bool on_device, int device, Stream stream, bool full,
                 bool copy) {
  const Problem& p = m.problem;
  const IndexView& num = full ? mask.full_kv_num_blocks : mask.kv_num_blocks;
  const IndexView& idx = full ? mask.full_kv_indices : mask.kv_indices;
  const char* nn = full ? "full_kv_num_blocks" : "kv_num_blocks";
  const char* in = full ? "full_kv_indices" : "kv_indices";
  std::vector<int64_t> vn = read(num, nn, 3, on_device, device, stream, copy);
  std::vector<int64_t> vi = read(idx, in, 4, on_device, device, stream, copy);
  broadcast_dim(num.shape[0], p.batch, nn, 0, "batch");
  broadcast_dim(num.shape[1], p.q_heads, nn, 1, "query heads");
  if (num.shape[2] < m.q_blocks())
    throw Error(std::string(nn) + " has " + std::to_string(num.shape[2]) + " query blocks (dimension 2), expected at least " +
                std::to_string(m.q_blocks()) + " (ceil(" + std::to_string(p.q_len) + " / " +
                std::to_string(m.layout.q_block) + "))");
  for (int i = 0; i < 3; ++i)
    if (idx.shape[size_t(i)] != num.shape[size_t(i)])
      throw Error(std::string(in) + " has shape " + idx.shape_text() + ", " + nn + " " + num.shape_text() +
                  ": their first three dimensions must agree");
  auto [b, h, q, k] = full ? std::tie(m.fb_b, m.fb_h, m.fb_q, m.fb_k) : std::tie(m.nb_b, m.nb_h, m.nb_q, m.nb_k);
  b = num.shape[0], h = num.shape[1], q = num.shape[2], k = idx.shape[3];
  (full ? m.full_num : m.num) = std::move(vn);
  (full ? m.full_idx : m.idx) = std::move(vi);
}

// Entry `e` of the list of query block qb of (b, h): its count and the start of its indices (`full`: full_*).
struct BlockRow {
  const int64_t* idx;
  int64_t count;
};
BlockRow block_row(const HostMask& m, bool full, int64_t b, int64_t h, int64_t qb) {
  const int64_t nb = full ? m.fb_b : m.nb_b, nh = full ? m.fb_h : m.nb_h, nq = full ? m.fb_q : m.nb_q,
                nk = full ? m.fb_k : m.nb_k;
  const int64_t row = ((nb == 1 ? 0 : b) * nh + (nh == 1 ? 0 : h)) * nq + qb;
  const std::vector<int64_t>& num = full ? m.full_num : m.num;
  const std::vector<int64_t>& idx = full ? m.full_idx : m.idx;
  return {idx.data() + row * nk, std::clamp<int64_t>(num[size_t(row)], 0, nk)};
}

int64_t topk_head(const HostMask& m, int64_t h) {
  if (m.tk_h == m.problem.q_heads) return h;
  if (m.tk_h == m.problem.kv_heads) return h / (m.problem.q_heads / m.problem.kv_heads);
  return 0;
}

}  // namespace

HostMask load_host_mask(const MaskLayout& layout, const Problem& problem, const RuntimeMask& mask, bool on_device,
                        int device, Stream stream, bool copy) {
  HostMask m;
  m.layout = layout;
  m.problem = problem;
  switch (layout.kind) {
    case MaskKind::blocks: {
      refuse_others(mask, {0, 1, 2, 3}, layout);
      need(mask.kv_num_blocks, "kv_num_blocks", layout);
      need(mask.kv_indices, "kv_indices", layout);
      if (mask.full_kv_num_blocks.present() != mask.full_kv_indices.present())
        throw Error("full_kv_num_blocks and full_kv_indices come together (one of them is missing)");
      load_blocks(m, mask, on_device, device, stream, false, copy);
      m.has_full = mask.full_kv_num_blocks.present();
      if (m.has_full) load_blocks(m, mask, on_device, device, stream, true, copy);
      break;
    }
    case MaskKind::documents: {
      refuse_others(mask, {4, 5}, layout);
      need(mask.cu_seqlens_q, "cu_seqlens_q", layout);
      m.cu_q = read(mask.cu_seqlens_q, "cu_seqlens_q", 1, on_device, device, stream, copy);
      if (mask.cu_seqlens_q.shape[0] < 1) throw Error("cu_seqlens_q is empty: expected n + 1 boundaries of n documents");
      if (mask.cu_seqlens_k.present()) {
        m.cu_k = read(mask.cu_seqlens_k, "cu_seqlens_k", 1, on_device, device, stream, copy);
        if (mask.cu_seqlens_k.shape[0] != mask.cu_seqlens_q.shape[0])
          throw Error("cu_seqlens_k has " + std::to_string(mask.cu_seqlens_k.shape[0]) + " boundaries, cu_seqlens_q " +
                      std::to_string(mask.cu_seqlens_q.shape[0]) + ": one document count for both");
      } else {
        if (problem.q_len != problem.kv_len)
          throw Error("cu_seqlens_k is needed where q_len (" + std::to_string(problem.q_len) + ") != kv_len (" +
                      std::to_string(problem.kv_len) + ")");
        m.cu_k = m.cu_q;
      }
      break;
    }
    case MaskKind::topk: {
      refuse_others(mask, {6}, layout);
      need(mask.topk_indices, "topk_indices", layout);
      const IndexView& t = mask.topk_indices;
      const int nd = t.ndim == 3 ? 3 : 4;
      m.topk = read(t, "topk_indices", nd, on_device, device, stream, copy);
      const int64_t K = t.shape[size_t(nd - 1)];
      m.tk_h = nd == 3 ? 1 : t.shape[2];
      if (t.shape[0] != problem.batch || t.shape[1] != problem.q_len || K != layout.topk)
        throw Error("topk_indices has shape " + t.shape_text() + ", expected " +
                    (nd == 3 ? dims_text({problem.batch, problem.q_len, layout.topk})
                             : dims_text({problem.batch, problem.q_len, problem.kv_heads, layout.topk})) +
                    " ([B, Lq, K] or [B, Lq, H, K], K the plan's)");
      if (m.tk_h != 1 && m.tk_h != problem.kv_heads && m.tk_h != problem.q_heads)
        throw Error("topk_indices has " + std::to_string(m.tk_h) + " heads (dimension 2), expected 1, kv_heads (" +
                    std::to_string(problem.kv_heads) + ") or q_heads (" + std::to_string(problem.q_heads) + ")");
      break;
    }
  }
  if (copy && !layout.spec.empty() && layout.kind != MaskKind::documents)
    m.spec = parse(layout.spec).bind(problem.q_len, problem.kv_len);
  return m;
}

void validate(const HostMask& m) {
  const Problem& p = m.problem;
  switch (m.layout.kind) {
    case MaskKind::blocks: {
      const int64_t nkb = m.k_blocks();
      std::vector<int64_t> seen(size_t(nkb), -1);  // the row (b, h, qb) that last listed each key block
      int64_t stamp = 0;
      for (int64_t b = 0; b < std::max(m.nb_b, m.has_full ? m.fb_b : 1); ++b)
        for (int64_t h = 0; h < std::max(m.nb_h, m.has_full ? m.fb_h : 1); ++h)
          for (int64_t qb = 0; qb < m.q_blocks(); ++qb, ++stamp)
            for (bool full : {false, true}) {
              if (full && !m.has_full) continue;
              const char* nn = full ? "full_kv_num_blocks" : "kv_num_blocks";
              const char* in = full ? "full_kv_indices" : "kv_indices";
              const int64_t nb = full ? m.fb_b : m.nb_b, nh = full ? m.fb_h : m.nb_h, nk = full ? m.fb_k : m.nb_k;
              const int64_t bb = nb == 1 ? 0 : b, hh = nh == 1 ? 0 : h;
              const int64_t row = (bb * nh + hh) * (full ? m.fb_q : m.nb_q) + qb;
              const int64_t count = (full ? m.full_num : m.num)[size_t(row)];
              auto at = [&] {  // "[b, h, qb" of the row, for the messages (built only where one is thrown)
                std::string t = "[";
                t.append(std::to_string(bb)).append(", ").append(std::to_string(hh)).append(", ");
                return t.append(std::to_string(qb));
              };
              if (count < 0 || count > nk || count > nkb)
                throw Error(std::string(nn) + at() + "] is " + std::to_string(count) + ", expected 0 to " +
                            std::to_string(std::min(nk, nkb)) + " (the indices' last dimension, and the " +
                            std::to_string(nkb) + " key blocks)");
              const BlockRow r = block_row(m, full, b, h, qb);
              for (int64_t j = 0; j < count; ++j) {
                const int64_t kb = r.idx[j];
                if (kb < 0 || kb >= nkb)
                  throw Error(std::string(in) + at() + ", " + std::to_string(j) + "] is " + std::to_string(kb) +
                              ", outside [0, " + std::to_string(nkb) + ") (key blocks of " + std::to_string(m.layout.k_block) +
                              " over " + std::to_string(p.kv_len) + " keys)");
                if (seen[size_t(kb)] == stamp)
                  throw Error(std::string(in) + at() + ", " + std::to_string(j) + "] lists key block " + std::to_string(kb) +
                              (full ? " that the row also lists in kv_indices or earlier in full_kv_indices"
                                    : " twice") + " (a block may be listed once)");
                seen[size_t(kb)] = stamp;
              }
            }
      break;
    }
    case MaskKind::documents: {
      for (bool keys : {false, true}) {
        const std::vector<int64_t>& cu = keys ? m.cu_k : m.cu_q;
        const int64_t L = keys ? p.kv_len : p.q_len;
        const char* name = keys ? "cu_seqlens_k" : "cu_seqlens_q";
        for (size_t i = 0; i < cu.size(); ++i) {
          if (cu[i] < 0 || cu[i] > L)
            throw Error(std::string(name) + "[" + std::to_string(i) + "] is " + std::to_string(cu[i]) + ", outside [0, " +
                        std::to_string(L) + "]");
          if (i > 0 && cu[i] < cu[i - 1])
            throw Error(std::string(name) + " is not non-decreasing: [" + std::to_string(i - 1) + "] is " +
                        std::to_string(cu[i - 1]) + ", [" + std::to_string(i) + "] is " + std::to_string(cu[i]));
        }
      }
      break;
    }
    case MaskKind::topk: {
      const int64_t K = m.layout.topk, rows = int64_t(m.topk.size()) / std::max<int64_t>(K, 1);
      std::vector<int64_t> seen(size_t(p.kv_len), -1);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < K; ++j) {
          const int64_t k = m.topk[size_t(r * K + j)];
          if (k == -1) continue;
          auto at = [&] {  // the entry's index, for the messages (built only where one is thrown)
            const int64_t b = r / (p.q_len * m.tk_h), q = (r / m.tk_h) % p.q_len, h = r % m.tk_h;
            std::string t = "topk_indices[";
            t.append(std::to_string(b)).append(", ").append(std::to_string(q)).append(", ");
            if (m.tk_h > 1) t.append(std::to_string(h)).append(", ");
            return t.append(std::to_string(j)).append("]");
          };
          if (k < 0 || k >= p.kv_len)
            throw Error(at() + " is " + std::to_string(k) + ", outside [0, " + std::to_string(p.kv_len) + ") (-1: padding)");
          if (seen[size_t(k)] == r) throw Error(at() + " repeats key " + std::to_string(k) + " (a key may be listed once)");
          seen[size_t(k)] = r;
        }
      break;
    }
  }
}

MaskPredicate::MaskPredicate(const HostMask& m) : m_(m) {
  if (m.layout.kind != MaskKind::documents || m.layout.spec.empty()) return;
  const Pattern spec = parse(m.layout.spec);
  for (int64_t i = 0; i < m.documents(); ++i) {
    const int64_t lq = m.cu_q[size_t(i + 1)] - m.cu_q[size_t(i)], lk = m.cu_k[size_t(i + 1)] - m.cu_k[size_t(i)];
    if (lq <= 0 || lk <= 0) {
      doc_spec_.emplace_back();
      continue;
    }
    try {
      doc_spec_.emplace_back(spec.bind(lq, lk));
    } catch (const Error& e) {
      throw Error("document " + std::to_string(i) + " (" + std::to_string(lq) + " x " + std::to_string(lk) + "): " + e.what());
    }
  }
}

bool MaskPredicate::contains(int64_t b, int64_t h, int64_t q, int64_t k) const {
  const HostMask& m = m_;
  switch (m.layout.kind) {
    case MaskKind::blocks: {
      const int64_t qb = q / m.layout.q_block, kb = k / m.layout.k_block;
      if (m.has_full) {
        const BlockRow f = block_row(m, true, b, h, qb);
        for (int64_t j = 0; j < f.count; ++j)
          if (f.idx[j] == kb) return true;
      }
      const BlockRow r = block_row(m, false, b, h, qb);
      for (int64_t j = 0; j < r.count; ++j)
        if (r.idx[j] == kb) return !m.spec || m.spec->contains(q, k);
      return false;
    }
    case MaskKind::documents: {
      for (int64_t i = 0; i < m.documents(); ++i) {
        const int64_t q0 = m.cu_q[size_t(i)], q1 = m.cu_q[size_t(i + 1)], k0 = m.cu_k[size_t(i)], k1 = m.cu_k[size_t(i + 1)];
        if (q < q0 || q >= q1) continue;
        if (k < k0 || k >= k1) return false;
        return doc_spec_.empty() || doc_spec_[size_t(i)]->contains(q - q0, k - k0);
      }
      return false;
    }
    case MaskKind::topk: {
      if (m.spec && m.spec->contains(q, k)) return true;
      const int64_t K = m.layout.topk;
      const int64_t* row = m.topk.data() + ((b * m.problem.q_len + q) * m.tk_h + topk_head(m, h)) * K;
      for (int64_t j = 0; j < K; ++j)
        if (row[j] == k) return true;
      return false;
    }
  }
  return false;
}

int64_t row_group(const HostMask& m, int64_t b, int64_t h) {
  const int64_t B = m.problem.batch, H = m.problem.q_heads;
  switch (m.layout.kind) {
    case MaskKind::blocks: {
      const int64_t pb = m.nb_b == 1 ? 0 : b, ph = m.nb_h == 1 ? 0 : h;
      const int64_t fb = m.has_full && m.fb_b != 1 ? b : 0, fh = m.has_full && m.fb_h != 1 ? h : 0;
      return ((pb * H + ph) * B + fb) * H + fh;
    }
    case MaskKind::documents: return 0;
    case MaskKind::topk: return b * H + topk_head(m, h);
  }
  return 0;
}

BoundPattern mask_rows(const HostMask& m, int64_t b, int64_t h) {
  const int64_t Lq = m.problem.q_len, Lk = m.problem.kv_len;
  std::vector<int64_t> offsets(size_t(Lq + 1), 0);
  std::vector<int32_t> cols;
  std::vector<int64_t> keys;
  auto push_row = [&](int64_t q) { offsets[size_t(q + 1)] = int64_t(cols.size()); };
  switch (m.layout.kind) {
    case MaskKind::blocks: {
      const int64_t QB = m.layout.q_block, KB = m.layout.k_block;
      std::vector<std::pair<int64_t, bool>> blocks;  // (key block, full), sorted
      for (int64_t qb = 0; qb < m.q_blocks(); ++qb) {
        blocks.clear();
        const BlockRow r = block_row(m, false, b, h, qb);
        for (int64_t j = 0; j < r.count; ++j) blocks.push_back({r.idx[j], false});
        if (m.has_full) {
          const BlockRow f = block_row(m, true, b, h, qb);
          for (int64_t j = 0; j < f.count; ++j) blocks.push_back({f.idx[j], true});
        }
        std::sort(blocks.begin(), blocks.end());
        for (int64_t q = qb * QB; q < std::min(Lq, (qb + 1) * QB); ++q) {
          const bool spec_row = m.spec && std::any_of(blocks.begin(), blocks.end(), [](auto& x) { return !x.second; });
          if (spec_row) m.spec->row_keys(q, keys);
          for (const auto& [kb, full] : blocks) {
            const int64_t k0 = kb * KB, k1 = std::min(Lk, k0 + KB);
            if (full || !m.spec) {
              for (int64_t k = k0; k < k1; ++k) cols.push_back(int32_t(k));
            } else {
              for (auto it = std::lower_bound(keys.begin(), keys.end(), k0); it != keys.end() && *it < k1; ++it)
                cols.push_back(int32_t(*it));
            }
          }
          push_row(q);
        }
      }
      for (int64_t q = m.q_blocks() * QB; q < Lq; ++q) push_row(q);
      break;
    }
    case MaskKind::documents: {
      const std::optional<Pattern> spec = m.layout.spec.empty() ? std::nullopt : std::optional<Pattern>(parse(m.layout.spec));
      int64_t q = 0;
      for (int64_t i = 0; i < m.documents(); ++i) {
        const int64_t q0 = m.cu_q[size_t(i)], q1 = m.cu_q[size_t(i + 1)], k0 = m.cu_k[size_t(i)], k1 = m.cu_k[size_t(i + 1)];
        for (; q < q0; ++q) push_row(q);  // between documents: nothing
        std::optional<BoundPattern> bound;
        if (spec && q1 > q0 && k1 > k0) {
          try {
            bound.emplace(spec->bind(q1 - q0, k1 - k0));
          } catch (const Error& e) {
            throw Error("document " + std::to_string(i) + " (" + std::to_string(q1 - q0) + " x " +
                        std::to_string(k1 - k0) + "): " + e.what());
          }
        }
        for (; q < q1; ++q) {
          if (bound) {
            bound->row_keys(q - q0, keys);
            for (int64_t k : keys) cols.push_back(int32_t(k + k0));
          } else {
            for (int64_t k = k0; k < k1; ++k) cols.push_back(int32_t(k));
          }
          push_row(q);
        }
      }
      for (; q < Lq; ++q) push_row(q);
      break;
    }
    case MaskKind::topk: {
      const int64_t K = m.layout.topk, th = topk_head(m, h);
      for (int64_t q = 0; q < Lq; ++q) {
        keys.clear();
        if (m.spec) m.spec->row_keys(q, keys);
        const int64_t* row = m.topk.data() + ((b * Lq + q) * m.tk_h + th) * K;
        for (int64_t j = 0; j < K; ++j)
          if (row[j] >= 0) keys.push_back(row[j]);
        std::sort(keys.begin(), keys.end());
        keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
        for (int64_t k : keys) cols.push_back(int32_t(k));
        push_row(q);
      }
      break;
    }
  }
  return BoundPattern::from_rows(Lq, Lk, std::move(offsets), std::move(cols));
}

BoundPattern predicate_rows(const MaskPredicate& p, const HostMask& m, int64_t b, int64_t h) {
  const int64_t Lq = m.problem.q_len, Lk = m.problem.kv_len;
  std::vector<int64_t> offsets(size_t(Lq + 1), 0);
  std::vector<int32_t> cols;
  for (int64_t q = 0; q < Lq; ++q) {
    for (int64_t k = 0; k < Lk; ++k)
      if (p.contains(b, h, q, k)) cols.push_back(int32_t(k));
    offsets[size_t(q + 1)] = int64_t(cols.size());
  }
  return BoundPattern::from_rows(Lq, Lk, std::move(offsets), std::move(cols));
}

}  // namespace spattn::plan
