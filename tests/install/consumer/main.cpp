// Parses and binds a spec through the installed headers and library.
#include <spattn/pattern.hpp>

int main() { return spattn::parse("local(2) | global(0)").bind(8).nnz() == 44 ? 0 : 1; }
