// python/src/tsvd.cpp — TSVD in spattn._core: compression (CPU, LAPACK) and the CPU TSVD matmul on numpy arrays.
// float32 C-order 2-D arrays in; the Python layer (spattn.tsvd_compress) converts other inputs first.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "spattn/tsvd.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using Matrix = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using NpMatrix = nb::ndarray<nb::numpy, float, nb::ndim<2>>;

// A new numpy float32 array of rows x cols that owns `v`'s data.
NpMatrix to_numpy(std::vector<float>&& v, int64_t rows, int64_t cols) {
  auto* heap = new std::vector<float>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  return NpMatrix(heap->data(), {size_t(rows), size_t(cols)}, owner);
}

// Block (i, j) of the factors, checked.
void check_tile(const spattn::TsvdFactors& f, int64_t i, int64_t j) {
  if (i < 0 || i >= f.tile_rows() || j < 0 || j >= f.tile_cols())
    throw spattn::Error("tile (" + std::to_string(i) + ", " + std::to_string(j) + ") is outside the " + std::to_string(f.tile_rows()) +
                        " x " + std::to_string(f.tile_cols()) + " tiles");
}

}  // namespace

void bind_tsvd(nb::module_& m) {
  nb::class_<spattn::TsvdFactors>(m, "TsvdFactors")
      .def_ro("k", &spattn::TsvdFactors::k)
      .def_ro("n", &spattn::TsvdFactors::n)
      .def_ro("tile_k", &spattn::TsvdFactors::tile_k)
      .def_ro("tile_n", &spattn::TsvdFactors::tile_n)
      .def_ro("common", &spattn::TsvdFactors::common)
      .def_ro("ranks", &spattn::TsvdFactors::ranks, "Per tile, row-major (per group with TSVD-common).")
      .def_prop_ro("tile_rows", &spattn::TsvdFactors::tile_rows)
      .def_prop_ro("tile_cols", &spattn::TsvdFactors::tile_cols)
      .def_prop_ro("stored", &spattn::TsvdFactors::stored, "Floats kept.")
      .def_prop_ro("compression", &spattn::TsvdFactors::compression, "K N / stored floats.")
      .def("rank", [](const spattn::TsvdFactors& f, int64_t i, int64_t j) {
             check_tile(f, i, j);
             return f.rank(i, j);
           },
           "i"_a, "j"_a)
      .def("a", [](const spattn::TsvdFactors& f, int64_t i, int64_t j) {
             check_tile(f, i, j);
             const int64_t rows = f.common ? f.tile_k : f.rows_of(i), r = f.rank(i, j);
             return to_numpy(std::vector<float>(f.a_block(i, j), f.a_block(i, j) + rows * r), rows, r);
           },
           "i"_a, "j"_a, "A of tile (i, j) = U_r S_r (a copy; TSVD-common: the group's shared A, tile_k rows).")
      .def("b", [](const spattn::TsvdFactors& f, int64_t i, int64_t j) {
             check_tile(f, i, j);
             const int64_t r = f.rank(i, j), cols = f.cols_of(j);
             return to_numpy(std::vector<float>(f.b_block(i, j), f.b_block(i, j) + r * cols), r, cols);
           },
           "i"_a, "j"_a, "B of tile (i, j) = V_r^T (a copy).")
      .def("matmul", [](const spattn::TsvdFactors& f, Matrix x, int threads) {
             if (int64_t(x.shape(1)) != f.k)
               throw spattn::Error("X has " + std::to_string(x.shape(1)) + " columns, the factors' K is " + std::to_string(f.k));
             const int64_t m = int64_t(x.shape(0));
             std::vector<float> y(size_t(m * f.n));
             {
               nb::gil_scoped_release unlocked;
               spattn::tsvd_matmul(f, x.data(), m, y.data(), threads);
             }
             return to_numpy(std::move(y), m, f.n);
           },
           "x"_a, "threads"_a = 0, "Y = X * TSVD(W) on the CPU (X: M x K float32), float32 M x N.")
      .def("reconstruct", [](const spattn::TsvdFactors& f) { return to_numpy(spattn::tsvd_reconstruct(f), f.k, f.n); },
           "W as the factors give it back (K x N).")
      .def("error", [](const spattn::TsvdFactors& f, Matrix w) {
             if (int64_t(w.shape(0)) != f.k || int64_t(w.shape(1)) != f.n)
               throw spattn::Error("W is " + std::to_string(w.shape(0)) + " x " + std::to_string(w.shape(1)) + ", the factors are for " +
                                   std::to_string(f.k) + " x " + std::to_string(f.n));
             const spattn::TsvdError e = spattn::tsvd_error(w.data(), f);
             return nb::make_tuple(e.total, e.tile);
           },
           "w"_a, "(total, per-tile list): relative Frobenius errors of the factors against W.")
      .def("save", [](const spattn::TsvdFactors& f, const std::string& path) { spattn::tsvd_save(f, path); }, "path"_a)
      .def("__repr__", [](const spattn::TsvdFactors& f) { return "<spattn.TsvdFactors " + f.describe() + ">"; });

  m.def(
      "tsvd_compress",
      [](Matrix w, int64_t tile_k, int64_t tile_n, int64_t rank, double ratio, double error, int64_t common, int threads) {
        spattn::TsvdOptions o;
        o.tile_k = tile_k, o.tile_n = tile_n, o.rank = rank, o.ratio = ratio, o.error = error, o.common = common, o.threads = threads;
        nb::gil_scoped_release unlocked;
        return spattn::tsvd_compress(w.data(), int64_t(w.shape(0)), int64_t(w.shape(1)), o);
      },
      "w"_a, "tile_k"_a, "tile_n"_a, "rank"_a, "ratio"_a, "error"_a, "common"_a, "threads"_a);
  m.def("tsvd_load", &spattn::tsvd_load, "path"_a, "Reads a .tsvd file; raises spattn.Error naming a bad field.");
}
