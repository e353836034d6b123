// common/args.hpp — command-line flags: "--name value" pairs and bare switches, every unknown or malformed flag an
// Error. Header-only; used by the programs (src/tools, bench), not by the library.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "spattn/error.hpp"

namespace spattn::common {

class Args {
 public:
  // `flags` take a value, `switches` do not.
  Args(int argc, char** argv, int first, const std::set<std::string>& flags, const std::set<std::string>& switches) {
    for (int i = first; i < argc; ++i) {
      std::string a = argv[i];
      if (a.rfind("--", 0) != 0 && !(a.size() == 2 && a[0] == '-'))
        throw Error("unexpected argument '" + a + "'");
      std::string name = a.substr(a.rfind("--", 0) == 0 ? 2 : 1);
      std::string value;
      const size_t eq = name.find('=');
      const bool inline_value = eq != std::string::npos;
      if (inline_value) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      }
      if (switches.count(name)) {
        if (inline_value) throw Error("option --" + name + " takes no value");
        set_.insert(name);
      } else if (flags.count(name)) {
        if (!inline_value) {
          if (i + 1 >= argc) throw Error("option --" + name + " needs a value");
          value = argv[++i];
        }
        if (values_.count(name)) throw Error("option --" + name + " is given twice");
        values_[name] = value;
      } else {
        throw Error("unknown option '" + a + "'");
      }
    }
  }
  bool has(const std::string& n) const { return values_.count(n) || set_.count(n); }
  std::string str(const std::string& n, const std::string& def = "") const {
    auto it = values_.find(n);
    return it == values_.end() ? def : it->second;
  }
  int64_t integer(const std::string& n, int64_t def) const {
    auto it = values_.find(n);
    if (it == values_.end()) return def;
    try {
      size_t used = 0;
      const long long v = std::stoll(it->second, &used);
      if (used != it->second.size()) throw 0;
      return v;
    } catch (...) {
      throw Error("option --" + n + " expects an integer, got '" + it->second + "'");
    }
  }
  double real(const std::string& n, double def) const {
    auto it = values_.find(n);
    if (it == values_.end()) return def;
    try {
      size_t used = 0;
      const double v = std::stod(it->second, &used);
      if (used != it->second.size()) throw 0;
      return v;
    } catch (...) {
      throw Error("option --" + n + " expects a number, got '" + it->second + "'");
    }
  }

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> set_;
};

}  // namespace spattn::common
