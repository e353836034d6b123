// cuda/backward/columns_backward.hpp — the backward of a compound plan's columns part (plan::BackwardPart, issue 39):
// its few keys (sparse_fixed's summaries, global columns) gathered into a small dense K/V, the tile backward run over
// the part's compact pattern with dQ added to what the earlier parts wrote, and the compact dK/dV added to the
// columns' rows of dk/dv once.
#pragma once
#include <cstdint>
#include <vector>

#include "cuda/backward/tile_backward.hpp"
#include "cuda/common/buffer.hpp"
#include "spattn/pattern.hpp"
#include "spattn/tensor.hpp"

namespace spattn::cuda {

class ColumnsBackward {
 public:
  // compact: the part's pattern over (Lq, columns.size()), compact key j standing for key columns[j] (increasing);
  // problem: the whole problem (kv_len the full key length); row: the tile backward's kernel-table row.
  ColumnsBackward(const BoundPattern& compact, const std::vector<int32_t>& columns, const Problem& problem, int row);

  // Requires TileBackward::refusal(...) == "" for the tensors. Adds the part's dQ to dq and its dK, dV to the
  // columns' rows of dk, dv (all written by an earlier part). Enqueued on `stream`.
  void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o, const TensorView& lse,
           const TensorView& dout, const TensorView& dq, const TensorView& dk, const TensorView& dv, void* stream) const;
  int kernel_row() const { return tile_.kernel_row(); }
  std::string explain() const { return tile_.explain(); }

 private:
  Problem problem_;  // the compact problem: kv_len = the columns
  TileBackward tile_;
  DeviceBuffer keys_, kc_, vc_, dkc_, dvc_;  // the columns; gathered K, V and their gradients [B, C, Hkv, D]
};

}  // namespace spattn::cuda
