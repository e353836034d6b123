// `spattn bench --device cpu`: placeholder until the fast CPU kernels land.
#include "spattn/error.hpp"
#include "tools/commands.hpp"

namespace spattn::tools {
int bench_cpu_main(int, char**) { throw Error("spattn bench --device cpu is not built yet"); }
}  // namespace spattn::tools
