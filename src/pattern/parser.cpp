// The spec parser: PATTERNS.md's grammar, presets expanded into atoms, every error naming text and column.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <limits>
#include <optional>
#include <sstream>

#include "pattern/ast.hpp"

namespace spattn {
namespace detail {
namespace {

using NodePtr = std::shared_ptr<const Node>;

// Parentheses and blocked(b, ...) nest by recursion (here, at bind time and when the tree is freed): deeper
// specs are refused so that a hostile one cannot exhaust the stack. 200 is far past any written by hand.
constexpr int kMaxNesting = 200;

struct Token {
  enum Type { Name, Number, Symbol, End } type = End;
  std::string text;
  int64_t column = 1;  // 1-based
};

class Parser {
 public:
  explicit Parser(std::string_view spec) : spec_(spec) { tokenize(); }

  NodePtr parse_all() {
    if (peek().type == Token::End) fail(peek(), "empty pattern spec");
    NodePtr n = parse_spec();
    if (peek().type != Token::End) fail(peek(), "unexpected trailing text '" + rest_from(peek()) + "'");
    return n;
  }

 private:
  // ---- errors ----
  [[noreturn]] void fail(const Token& t, const std::string& what) const { fail_at(t.column, what); }
  // The length of the valid UTF-8 sequence at byte i of s (1 for ASCII), 0 where none starts there.
  static size_t utf8_len(std::string_view s, size_t i) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return 0;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return 0;
    return n;
  }
  // Text for a message that stays valid UTF-8: what is not (a byte of a sequence cut short, a stray byte) as \xNN.
  static std::string printable(std::string_view s) {
    std::string out;
    char buf[8];
    for (size_t i = 0; i < s.size();) {
      const size_t n = utf8_len(s, i);
      if (n) {
        out.append(s.substr(i, n));
        i += n;
      } else {
        std::snprintf(buf, sizeof buf, "\\x%02X", static_cast<unsigned char>(s[i++]));
        out += buf;
      }
    }
    return out;
  }
  // The character at byte i, quoted: a whole UTF-8 sequence with its code point ('∪' (U+222A); one byte of it made
  // the message invalid UTF-8), a byte that starts none as \xNN.
  static std::string quoted_char(std::string_view s, size_t i) {
    const size_t n = utf8_len(s, i);
    char buf[32];
    if (n == 1 && std::isprint(static_cast<unsigned char>(s[i]))) return "'" + std::string(1, s[i]) + "'";
    if (n <= 1) {
      std::snprintf(buf, sizeof buf, "byte \\x%02X", static_cast<unsigned char>(s[i]));
      return buf;
    }
    uint32_t cp = static_cast<unsigned char>(s[i]) & (0x7Fu >> n);
    for (size_t k = 1; k < n; ++k) cp = cp << 6 | (static_cast<unsigned char>(s[i + k]) & 0x3Fu);
    std::snprintf(buf, sizeof buf, " (U+%04X)", cp);
    return "'" + std::string(s.substr(i, n)) + "'" + buf;
  }
  [[noreturn]] void fail_at(int64_t column, const std::string& what) const {
    std::ostringstream os;
    os << "pattern error at column " << column << ": " << what << " (in \"" << excerpt(column) << "\")";
    throw Error(os.str());
  }
  // The spec, or for a long one the text around `column` (a message quoting 30000 characters helps nobody).
  std::string excerpt(int64_t column) const {
    constexpr size_t kWhole = 160, kSide = 40;
    if (spec_.size() <= kWhole) return printable(spec_);
    const size_t at = std::min(size_t(column - 1), spec_.size());
    const size_t b = at > kSide ? at - kSide : 0, e = std::min(spec_.size(), at + kSide);
    return (b > 0 ? "..." : "") + printable(spec_.substr(b, e - b)) + (e < spec_.size() ? "..." : "");
  }
  std::string rest_from(const Token& t) const { return std::string(spec_.substr(size_t(t.column - 1))); }
  std::string text_between(int64_t col0, int64_t col1) const {  // [col0, col1) 1-based
    return std::string(spec_.substr(size_t(col0 - 1), size_t(col1 - col0)));
  }

  // ---- tokens ----
  void tokenize() {
    size_t i = 0;
    while (i < spec_.size()) {
      const char c = spec_[i];
      if (std::isspace(static_cast<unsigned char>(c))) {
        ++i;
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t j = i;
        while (j < spec_.size() && (std::isalnum(static_cast<unsigned char>(spec_[j])) || spec_[j] == '_')) ++j;
        toks_.push_back({Token::Name, std::string(spec_.substr(i, j - i)), int64_t(i + 1)});
        i = j;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t j = i;
        while (j < spec_.size() && std::isalnum(static_cast<unsigned char>(spec_[j]))) ++j;
        toks_.push_back({Token::Number, std::string(spec_.substr(i, j - i)), int64_t(i + 1)});
        i = j;
      } else if (std::string_view("()=,:|&-").find(c) != std::string_view::npos) {
        toks_.push_back({Token::Symbol, std::string(1, c), int64_t(i + 1)});
        ++i;
      } else {
        fail_at(int64_t(i + 1), "unexpected character " + quoted_char(spec_, i));
      }
    }
    toks_.push_back({Token::End, "", int64_t(spec_.size() + 1)});
  }
  const Token& peek(size_t ahead = 0) const { return toks_[std::min(pos_ + ahead, toks_.size() - 1)]; }
  const Token& next() { return toks_[std::min(pos_++, toks_.size() - 1)]; }
  bool is_sym(const Token& t, char c) const { return t.type == Token::Symbol && t.text[0] == c; }
  const Token& expect_sym(char c, const char* context) {
    const Token& t = peek();
    if (!is_sym(t, c)) {
      fail(t, std::string("expected '") + c + "' " + context + ", found " +
                  (t.type == Token::End ? std::string("end of spec") : "'" + t.text + "'"));
    }
    return next();
  }

  // ---- grammar ----
  // One level of nesting ('(' or blocked's inner spec) opened at `column`, closed when it goes out of scope.
  class Nest {
   public:
    Nest(Parser& p, int64_t column) : p_(p) {
      if (++p_.depth_ > kMaxNesting)
        p_.fail_at(column, "nesting deeper than " + std::to_string(kMaxNesting) +
                               " levels of parentheses and blocked(...)");
    }
    ~Nest() { --p_.depth_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;

   private:
    Parser& p_;
  };

  NodePtr parse_spec() {
    const int64_t col = peek().column;
    std::vector<NodePtr> terms{parse_term()};
    while (is_sym(peek(), '|')) {
      next();
      terms.push_back(parse_term());
    }
    if (terms.size() == 1) return terms[0];
    auto n = std::make_shared<Node>();
    n->kind = Kind::Union;
    n->column = col;
    n->children = std::move(terms);
    return n;
  }
  NodePtr parse_term() {
    const int64_t col = peek().column;
    std::vector<NodePtr> factors{parse_factor()};
    while (is_sym(peek(), '&')) {
      next();
      factors.push_back(parse_factor());
    }
    if (factors.size() == 1) return factors[0];
    auto n = std::make_shared<Node>();
    n->kind = Kind::Inter;
    n->column = col;
    n->children = std::move(factors);
    return n;
  }
  NodePtr parse_factor() {
    const Token& t = peek();
    if (is_sym(t, '(')) {
      const Nest nest(*this, t.column);
      next();
      NodePtr n = parse_spec();
      expect_sym(')', "to close the parenthesis");
      return n;
    }
    if (t.type == Token::Name) return parse_atom();
    if (t.type == Token::End) fail(t, "expected a pattern, found end of spec");
    fail(t, "expected a pattern name or '(', found '" + t.text + "'");
  }

  // An argument as written: positional or named; its value kept as a token range to be read by the atom.
  struct Arg {
    std::string name;  // empty: positional
    int64_t column = 1;
    size_t begin = 0, end = 0;  // token range of the value
  };

  // Reads "( arg, arg, ... )" returning the token ranges; nested parentheses are skipped over.
  std::vector<Arg> read_args(const Token& atom) {
    std::vector<Arg> args;
    if (!is_sym(peek(), '(')) return args;
    next();
    if (is_sym(peek(), ')')) fail(peek(), "'" + atom.text + "(' needs at least one argument; write '" + atom.text + "' alone");
    while (true) {
      Arg a;
      a.column = peek().column;
      if (peek().type == Token::Name && is_sym(peek(1), '=')) {
        a.name = next().text;
        next();
      }
      a.begin = pos_;
      int depth = 0;
      while (true) {
        const Token& t = peek();
        if (t.type == Token::End) fail(t, "missing ')' to close the arguments of '" + atom.text + "'");
        if (is_sym(t, '(')) ++depth;
        if (is_sym(t, ')')) {
          if (depth == 0) break;
          --depth;
        }
        if (is_sym(t, ',') && depth == 0) break;
        next();
      }
      a.end = pos_;
      if (a.begin == a.end) fail(peek(), "empty argument to '" + atom.text + "'");
      args.push_back(a);
      if (is_sym(peek(), ',')) {
        next();
        continue;
      }
      next();  // ')'
      break;
    }
    return args;
  }

  // ---- values ----
  int64_t parse_int_token(size_t& p, size_t end) const {
    bool neg = false;
    const int64_t col = toks_[p].column;
    if (p < end && is_sym(toks_[p], '-')) {
      neg = true;
      ++p;
    }
    if (p >= end || toks_[p].type != Token::Number) fail_at(p < end ? toks_[p].column : col, "expected an integer");
    const std::string& s = toks_[p].text;
    for (char c : s)
      if (!std::isdigit(static_cast<unsigned char>(c))) fail(toks_[p], "'" + s + "' is not an integer");
    // Accumulate as negative to reach INT64_MIN exactly.
    int64_t v = 0;
    for (char c : s) {
      const int d = c - '0';
      if (v < (std::numeric_limits<int64_t>::min() + d) / 10) {
        fail_at(col, "number '" + std::string(neg ? "-" : "") + s + "' does not fit in a signed 64-bit integer");
      }
      v = v * 10 - d;
    }
    if (!neg) {
      if (v == std::numeric_limits<int64_t>::min())
        fail_at(col, "number '" + s + "' does not fit in a signed 64-bit integer");
      v = -v;
    }
    ++p;
    return v;
  }
  int64_t int_value(const Arg& a, const Token& atom, const char* pname) const {
    size_t p = a.begin;
    if (toks_[p].type != Token::Number && !is_sym(toks_[p], '-'))
      fail_at(a.column, std::string("argument '") + pname + "' of '" + atom.text + "' must be an integer, found '" +
                            text_of(a) + "'");
    const int64_t v = parse_int_token(p, a.end);
    if (p != a.end) fail(toks_[p], std::string("unexpected '") + toks_[p].text + "' in argument '" + pname + "' of '" + atom.text + "'");
    return v;
  }
  std::string text_of(const Arg& a) const {
    const int64_t c1 = a.end < toks_.size() ? toks_[a.end].column : int64_t(spec_.size() + 1);
    std::string s = text_between(toks_[a.begin].column, c1);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
    return s;
  }
  // An element of an index set: integer or range a:b.
  void index_item(const Arg& a, const Token& atom, IndexSet& set) const {
    size_t p = a.begin;
    const int64_t lo = parse_int_token(p, a.end);
    int64_t hi = lo + 1;
    if (p < a.end && is_sym(toks_[p], ':')) {
      ++p;
      const int64_t col = p < a.end ? toks_[p].column : a.column;
      hi = parse_int_token(p, a.end);
      if (hi < lo) fail_at(col, "range " + text_of(a) + " of '" + atom.text + "' ends before it starts");
    } else if (lo == std::numeric_limits<int64_t>::max()) {
      fail_at(a.column, "index " + text_of(a) + " of '" + atom.text + "' is out of range");
    }
    if (p != a.end) fail(toks_[p], "unexpected '" + toks_[p].text + "' in '" + atom.text + "' (expected an index or a range a:b)");
    if (lo < 0) fail_at(a.column, "index " + text_of(a) + " of '" + atom.text + "' is negative (out of range)");
    if (lo < hi) set.push_back({lo, hi});
  }
  // A tuple (v, v, ...) or a single integer, for neighborhood.
  std::vector<int64_t> tuple_value(const Arg& a, const Token& atom) const {
    std::vector<int64_t> vals;
    size_t p = a.begin;
    if (is_sym(toks_[p], '(')) {
      ++p;
      while (true) {
        vals.push_back(parse_int_token(p, a.end));
        if (p < a.end && is_sym(toks_[p], ',')) {
          ++p;
          continue;
        }
        if (p < a.end && is_sym(toks_[p], ')')) {
          ++p;
          break;
        }
        fail_at(p < a.end ? toks_[p].column : a.column, "malformed tuple '" + text_of(a) + "' in '" + atom.text + "'");
      }
    } else {
      vals.push_back(parse_int_token(p, a.end));
    }
    if (p != a.end) fail(toks_[p], "unexpected '" + toks_[p].text + "' after '" + a.name + "' of '" + atom.text + "'");
    if (vals.size() > 3) fail_at(a.column, "'" + a.name + "' of '" + atom.text + "' has more than 3 axes");
    return vals;
  }

  // Binds positional and named arguments to parameter names; reports missing, repeated, extra and unknown.
  std::vector<std::optional<Arg>> bind_params(const Token& atom, const std::vector<Arg>& args,
                                               const std::vector<std::string>& params, size_t required) const {
    std::vector<std::optional<Arg>> out(params.size());
    size_t positional = 0;
    bool seen_named = false;
    for (const Arg& a : args) {
      size_t idx;
      if (a.name.empty()) {
        if (seen_named) fail_at(a.column, "positional argument after a named one in '" + atom.text + "'");
        if (positional >= params.size())
          fail_at(a.column, "extra argument '" + text_of(a) + "' to '" + atom.text + "' (it takes " + signature(atom.text, params, required) + ")");
        idx = positional++;
      } else {
        seen_named = true;
        auto it = std::find(params.begin(), params.end(), a.name);
        if (it == params.end())
          fail_at(a.column, "unknown argument '" + a.name + "' to '" + atom.text + "' (it takes " + signature(atom.text, params, required) + ")");
        idx = size_t(it - params.begin());
      }
      if (out[idx]) fail_at(a.column, "argument '" + params[idx] + "' of '" + atom.text + "' is given twice");
      out[idx] = a;
    }
    for (size_t i = 0; i < required; ++i)
      if (!out[i]) fail(atom, "missing argument '" + params[i] + "' of '" + atom.text + "' (it takes " + signature(atom.text, params, required) + ")");
    return out;
  }
  static std::string signature(const std::string& name, const std::vector<std::string>& params, size_t required) {
    std::string s = name + "(";
    for (size_t i = 0; i < params.size(); ++i) s += (i ? ", " : "") + params[i] + (i >= required ? "=..." : "");
    return s + ")";
  }

  // ---- atoms ----
  std::shared_ptr<Node> make(Kind k, const Token& atom, int64_t end_col) const {
    auto n = std::make_shared<Node>();
    n->kind = k;
    n->column = atom.column;
    n->text = text_between(atom.column, end_col);
    while (!n->text.empty() && std::isspace(static_cast<unsigned char>(n->text.back()))) n->text.pop_back();
    return n;
  }
  void require_min(const Token& atom, const Arg& a, const char* pname, int64_t v, int64_t min, const char* what) const {
    if (v < min) {
      fail_at(a.column, std::string(what) + " '" + pname + "' of '" + atom.text + "' is " + std::to_string(v) +
                            (min == 0 ? "; it must not be negative" : "; it must be at least " + std::to_string(min)));
    }
  }

  NodePtr parse_atom() {
    const Token atom = next();
    const std::vector<Arg> args = read_args(atom);
    const int64_t end_col = peek().column;
    const std::string& name = atom.text;
    auto ints = [&](const std::vector<std::string>& params, size_t required, std::vector<int64_t> defaults) {
      auto bound = bind_params(atom, args, params, required);
      std::vector<int64_t> v(params.size());
      for (size_t i = 0; i < params.size(); ++i) v[i] = bound[i] ? int_value(*bound[i], atom, params[i].c_str()) : defaults[i];
      return std::make_pair(v, bound);
    };
    auto col_of = [&](const std::vector<std::optional<Arg>>& b, size_t i) { return b[i] ? *b[i] : Arg{"", atom.column, 0, 0}; };
    auto no_args = [&]() {
      if (!args.empty()) fail_at(args[0].column, "'" + name + "' takes no arguments");
    };

    if (name == "dense" || name == "causal") {
      no_args();
      return make(name == "dense" ? Kind::Dense : Kind::Causal, atom, end_col);
    }
    if (name == "local") {
      const bool named = std::any_of(args.begin(), args.end(), [](const Arg& a) { return a.name == "left" || a.name == "right"; });
      auto n = make(Kind::Local, atom, end_col);
      if (named) {
        auto [v, b] = ints({"left", "right"}, 2, {0, 0});
        require_min(atom, col_of(b, 0), "left", v[0], 0, "window");
        require_min(atom, col_of(b, 1), "right", v[1], 0, "window");
        n->a = v[0];
        n->b = v[1];
      } else {
        auto [v, b] = ints({"w"}, 1, {0});
        require_min(atom, col_of(b, 0), "w", v[0], 0, "window");
        n->a = n->b = v[0];
      }
      return n;
    }
    if (name == "dilated") {
      auto [v, b] = ints({"w", "d"}, 2, {0, 0});
      require_min(atom, col_of(b, 0), "w", v[0], 0, "window");
      require_min(atom, col_of(b, 1), "d", v[1], 1, "dilation");
      auto n = make(Kind::Dilated, atom, end_col);
      n->a = v[0];
      n->b = v[1];
      return n;
    }
    if (name == "stride" || name == "block_diag") {
      auto [v, b] = ints({"s"}, 1, {0});
      require_min(atom, col_of(b, 0), "s", v[0], 1, name == "stride" ? "stride" : "block size");
      auto n = make(name == "stride" ? Kind::Stride : Kind::BlockDiag, atom, end_col);
      n->a = v[0];
      return n;
    }
    if (name == "summary") {
      auto [v, b] = ints({"s", "c"}, 1, {0, 1});
      require_min(atom, col_of(b, 0), "s", v[0], 1, "block size");
      require_min(atom, col_of(b, 1), "c", v[1], 0, "count");
      auto n = make(Kind::Summary, atom, end_col);
      n->a = v[0];
      n->b = v[1];
      return n;
    }
    if (name == "global" || name == "global_rows" || name == "global_cols") {
      if (args.empty()) fail(atom, "'" + name + "' needs a list of indices or ranges, e.g. " + name + "(0:32)");
      auto n = make(name == "global" ? Kind::Global : name == "global_rows" ? Kind::GlobalRows : Kind::GlobalCols, atom, end_col);
      for (const Arg& a : args) {
        if (!a.name.empty()) fail_at(a.column, "'" + name + "' takes indices and ranges, not named arguments");
        index_item(a, atom, n->set);
      }
      canonical(n->set);
      return n;
    }
    if (name == "random") {
      auto [v, b] = ints({"r", "seed"}, 1, {0, 0});
      require_min(atom, col_of(b, 0), "r", v[0], 0, "count");
      auto n = make(Kind::Random, atom, end_col);
      n->a = v[0];
      n->b = v[1];
      return n;
    }
    if (name == "document") {
      if (args.empty()) fail(atom, "'document' needs segment lengths, e.g. document(1024, 3072)");
      auto n = make(Kind::Document, atom, end_col);
      for (const Arg& a : args) {
        if (!a.name.empty()) fail_at(a.column, "'document' takes segment lengths, not named arguments");
        const int64_t v = int_value(a, atom, "segment length");
        if (v < 1) fail_at(a.column, "segment length " + std::to_string(v) + " of '" + atom.text + "' must be at least 1");
        n->segments.push_back(v);
      }
      return n;
    }
    if (name == "blocked") {
      auto b = bind_params(atom, args, {"b", "spec"}, 2);
      const int64_t bs = int_value(*b[0], atom, "b");
      require_min(atom, *b[0], "b", bs, 1, "block size");
      // Parse the nested spec in place: its tokens are [begin, end).
      const size_t save = pos_;
      pos_ = b[1]->begin;
      const Nest nest(*this, atom.column);
      NodePtr inner = parse_spec();
      if (pos_ != b[1]->end) fail(peek(), "unexpected '" + peek().text + "' in the spec of '" + atom.text + "'");
      pos_ = save;
      auto n = make(Kind::Blocked, atom, end_col);
      n->a = bs;
      n->children = {inner};
      return n;
    }
    if (name == "neighborhood") return parse_neighborhood(atom, args, end_col);

    // ---- presets ----
    if (name == "longformer") {  // local(w) | global(0:g)
      auto [v, b] = ints({"w", "g"}, 2, {0, 0});
      require_min(atom, col_of(b, 0), "w", v[0], 0, "window");
      require_min(atom, col_of(b, 1), "g", v[1], 0, "count");
      return union_of(atom, end_col, {local_node(atom, v[0], v[0]), global_prefix(atom, v[1])});
    }
    if (name == "bigbird") {  // blocked(b, local(w) | global(0:g) | random(r, seed=x))
      auto [v, b] = ints({"b", "w", "g", "r", "seed"}, 4, {0, 0, 0, 0, 0});
      require_min(atom, col_of(b, 0), "b", v[0], 1, "block size");
      require_min(atom, col_of(b, 1), "w", v[1], 0, "window");
      require_min(atom, col_of(b, 2), "g", v[2], 0, "count");
      require_min(atom, col_of(b, 3), "r", v[3], 0, "count");
      auto rnd = make(Kind::Random, atom, end_col);
      rnd->a = v[3];
      rnd->b = v[4];
      auto inner = union_of(atom, end_col, {local_node(atom, v[1], v[1]), global_prefix(atom, v[2]), rnd});
      auto n = make(Kind::Blocked, atom, end_col);
      n->a = v[0];
      n->children = {inner};
      return n;
    }
    if (name == "sparse_fixed") {  // block_diag(s) | summary(s, c)
      auto [v, b] = ints({"s", "c"}, 1, {0, 1});
      require_min(atom, col_of(b, 0), "s", v[0], 1, "block size");
      require_min(atom, col_of(b, 1), "c", v[1], 0, "count");
      auto bd = make(Kind::BlockDiag, atom, end_col);
      bd->a = v[0];
      auto sm = make(Kind::Summary, atom, end_col);
      sm->a = v[0];
      sm->b = v[1];
      return union_of(atom, end_col, {bd, sm});
    }
    if (name == "sparse_strided") {  // local(left=s-1, right=0) | (stride(s) & causal)
      auto [v, b] = ints({"s"}, 1, {0});
      require_min(atom, col_of(b, 0), "s", v[0], 1, "stride");
      auto st = make(Kind::Stride, atom, end_col);
      st->a = v[0];
      auto inter = std::make_shared<Node>();
      inter->kind = Kind::Inter;
      inter->column = atom.column;
      inter->children = {st, make(Kind::Causal, atom, end_col)};
      return union_of(atom, end_col, {local_node(atom, v[0] - 1, 0), inter});
    }
    fail(atom, "unknown pattern name '" + name + "'");
  }

  std::shared_ptr<Node> local_node(const Token& atom, int64_t left, int64_t right) const {
    auto n = make(Kind::Local, atom, atom.column + int64_t(atom.text.size()));
    n->a = left;
    n->b = right;
    return n;
  }
  std::shared_ptr<Node> global_prefix(const Token& atom, int64_t g) const {
    auto n = make(Kind::Global, atom, atom.column + int64_t(atom.text.size()));
    if (g > 0) n->set.push_back({0, g});
    n->clip = true;  // presets clip their global range to the length
    return n;
  }
  NodePtr union_of(const Token& atom, int64_t, std::vector<NodePtr> parts) const {
    auto n = std::make_shared<Node>();
    n->kind = Kind::Union;
    n->column = atom.column;
    n->children = std::move(parts);
    return n;
  }
  static void canonical(IndexSet& s) {
    std::sort(s.begin(), s.end());
    size_t w = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (w && s[i].first <= s[w - 1].second) {
        s[w - 1].second = std::max(s[w - 1].second, s[i].second);
      } else {
        s[w++] = s[i];
      }
    }
    s.resize(w);
  }

  NodePtr parse_neighborhood(const Token& atom, const std::vector<Arg>& args, int64_t end_col) {
    auto b = bind_params(atom, args, {"dims", "kernel", "dilation", "causal"}, 0);
    for (const Arg& a : args)
      if (a.name.empty()) fail_at(a.column, "'neighborhood' takes named arguments: dims=, kernel=, dilation=, causal=");
    if (!b[1]) fail(atom, "missing argument 'kernel' of '" + atom.text + "'");
    std::vector<int64_t> vals[4];
    for (int i = 0; i < 4; ++i)
      if (b[size_t(i)]) vals[i] = tuple_value(*b[size_t(i)], atom);
    auto n = make(Kind::Neighborhood, atom, end_col);
    size_t naxes = 1;
    if (b[0]) {
      naxes = vals[0].size();
    } else {
      for (int i = 1; i < 4; ++i)
        if (vals[i].size() > 1)
          fail_at(b[size_t(i)]->column, "'" + atom.text + "' has a " + std::to_string(vals[i].size()) +
                                            "-axis tuple but no dims=(...); dims may be omitted only for 1-D");
    }
    static const char* names[4] = {"dims", "kernel", "dilation", "causal"};
    for (int i = 1; i < 4; ++i) {
      if (b[size_t(i)] && vals[i].size() != 1 && vals[i].size() != naxes)
        fail_at(b[size_t(i)]->column, std::string("'") + names[i] + "' of '" + atom.text + "' has " + std::to_string(vals[i].size()) +
                                          " values for " + std::to_string(naxes) + " axes");
    }
    n->naxes = int(naxes);
    for (size_t ax = 0; ax < naxes; ++ax) {
      auto pick = [&](int i, int64_t def) { return vals[i].empty() ? def : vals[i].size() == 1 ? vals[i][0] : vals[i][ax]; };
      n->dims[ax] = b[0] ? vals[0][ax] : 0;
      n->kernel[ax] = pick(1, 1);
      n->dilation[ax] = pick(2, 1);
      const int64_t c = pick(3, 0);
      if (b[0] && n->dims[ax] < 1) fail_at(b[0]->column, "axis size " + std::to_string(n->dims[ax]) + " in 'dims' of '" + atom.text + "' must be at least 1");
      if (n->kernel[ax] < 1) fail_at(b[1]->column, "kernel size " + std::to_string(n->kernel[ax]) + " of '" + atom.text + "' must be at least 1");
      if (n->dilation[ax] < 1) fail_at(b[2]->column, "dilation " + std::to_string(n->dilation[ax]) + " of '" + atom.text + "' must be at least 1");
      if (c != 0 && c != 1) fail_at(b[3]->column, "'causal' of '" + atom.text + "' takes 0 or 1 per axis, found " + std::to_string(c));
      n->causal[ax] = c == 1;
    }
    return n;
  }

  std::string_view spec_;
  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;  // open levels of nesting (Nest)
};

}  // namespace

std::shared_ptr<const Node> parse_node(std::string_view spec) { return Parser(spec).parse_all(); }

}  // namespace detail

Pattern Pattern::parse(std::string_view spec) {
  Pattern p;
  p.spec_ = std::string(spec);
  p.root_ = detail::parse_node(p.spec_);
  return p;
}

}  // namespace spattn
