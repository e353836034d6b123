// python/src/module.cpp — spattn._core, the nanobind extension under the Python package `spattn`.
//
// Arrays come in through DLPack and are never copied: each argument becomes a spattn::TensorView over the
// caller's memory. Objects whose type publishes the DLPack C exchange API (`__dlpack_c_exchange_api__`, DLPack
// 1.2+: torch.Tensor since 2.9) are read through its non-owning `dltensor_from_py_object_no_sync`, which costs
// well under a microsecond and also tells the caller's current CUDA stream; everything else goes through
// nanobind's ndarray import (`__dlpack__`, the buffer protocol: numpy, cupy, jax, ...). spattn::Error becomes
// spattn.Error (a ValueError) with the C++ message. The package's Python layer (python/spattn/*.py) allocates
// outputs and holds the user-facing signatures; this file is the thin typed core.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "spattn/config.hpp"
#include "spattn/device.hpp"
#include "spattn/distributed.hpp"
#include "spattn/format.hpp"
#include "spattn/plan.hpp"
#include "spattn/runtime_mask.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// ---- DLPack ------------------------------------------------------------------------------------------
// DLPack's device types and dtype codes (dlpack.h), and the exchange API table of DLPack 1.2+ laid out as
// the standard fixes it (only the members used here are typed).
constexpr int32_t kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13;
constexpr uint8_t kDLFloat = 2, kDLBfloat = 4;

struct DLPackVersion {
  uint32_t major, minor;
};
struct DLPackExchangeAPIHeader {
  DLPackVersion version;
  DLPackExchangeAPIHeader* prev_api;
};
struct DLPackExchangeAPI {
  DLPackExchangeAPIHeader header;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void* py_object, nb::dlpack::dltensor* out);
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void** out_current_stream);
};

// The exchange API of a type, or null; looked up once per type (types are kept alive by the cache).
const DLPackExchangeAPI* exchange_api(PyTypeObject* tp) {
  struct Entry {
    PyTypeObject* type;
    const DLPackExchangeAPI* api;
  };
  static std::vector<Entry> cache;  // guarded by the GIL
  for (const Entry& e : cache)
    if (e.type == tp) return e.api;
  const DLPackExchangeAPI* api = nullptr;
  PyObject* cap = PyObject_GetAttrString(reinterpret_cast<PyObject*>(tp), "__dlpack_c_exchange_api__");
  if (!cap) {
    PyErr_Clear();
  } else {
    if (PyCapsule_CheckExact(cap) && PyCapsule_IsValid(cap, "dlpack_exchange_api")) {
      auto* a = static_cast<const DLPackExchangeAPI*>(PyCapsule_GetPointer(cap, "dlpack_exchange_api"));
      // Walk to a table of major version 1 (the layout above); older or unknown tables are not used.
      for (const DLPackExchangeAPIHeader* h = a ? &a->header : nullptr; h; h = h->prev_api)
        if (h->version.major == 1 && h->version.minor >= 2) {
          api = reinterpret_cast<const DLPackExchangeAPI*>(h);
          break;
        }
      if (api && !api->dltensor_from_py_object_no_sync) api = nullptr;
    }
    PyErr_Clear();
    Py_DECREF(cap);
  }
  Py_INCREF(tp);
  cache.push_back({tp, api});
  return api;
}

std::string dtype_text(const nb::dlpack::dtype& t) {
  std::string s;
  switch (t.code) {
    case 0: s = "int"; break;
    case 1: s = "uint"; break;
    case kDLFloat: s = "float"; break;
    case kDLBfloat: s = "bfloat"; break;
    case 5: s = "complex"; break;
    case 6: return "bool";
    default: s = "dlpack code " + std::to_string(t.code) + ", bits "; break;
  }
  s += std::to_string(t.bits);
  if (t.lanes != 1) s += "x" + std::to_string(t.lanes);
  return s;
}

std::optional<spattn::DType> dtype_of(const nb::dlpack::dtype& t) {
  if (t.lanes != 1) return std::nullopt;
  if (t.code == kDLFloat && t.bits == 32) return spattn::DType::f32;
  if (t.code == kDLFloat && t.bits == 16) return spattn::DType::f16;
  if (t.code == kDLFloat && t.bits == 64) return spattn::DType::f64;
  if (t.code == kDLBfloat && t.bits == 16) return spattn::DType::bf16;
  return std::nullopt;
}

std::string device_text(int32_t type, int32_t id) {
  if (type == kDLCPU) return "cpu";
  if (type == kDLCUDA) return "cuda:" + std::to_string(id);
  if (type == kDLCUDAHost) return "cuda host memory";
  if (type == kDLCUDAManaged) return "cuda managed memory";
  return "dlpack device type " + std::to_string(type);
}

// One array argument as a TensorView (4-D [B, L, H, D] after the layout swap; 3-D lse [B, H, L] as
// {B, H, L, 1}). `keep` holds the nanobind import alive for the duration of the call.
struct Arg {
  spattn::TensorView view;
  int32_t device_type = kDLCPU, device_id = 0;
  const DLPackExchangeAPI* api = nullptr;
  std::optional<nb::ndarray<>> keep;
  std::optional<nb::ndarray<nb::ro>> keep_ro;
};

void fill(Arg& a, const nb::dlpack::dltensor& t, const char* name, int want_ndim, bool swap12) {
  if (t.ndim != want_ndim)
    throw spattn::Error(std::string(name) + " has " + std::to_string(t.ndim) + " dimensions, expected " +
                        std::to_string(want_ndim) + (want_ndim == 4 ? " ([B, L, H, D])" : " ([B, H, L])"));
  const auto dt = dtype_of(t.dtype);
  if (!dt)
    throw spattn::Error(std::string(name) + " has dtype " + dtype_text(t.dtype) +
                        ", expected float32, float16, bfloat16 or float64");
  a.view.dtype = *dt;
  a.view.data = static_cast<char*>(t.data) + t.byte_offset;
  a.device_type = t.device.device_type;
  a.device_id = t.device.device_id;
  std::array<int64_t, 4> shape{1, 1, 1, 1}, stride{0, 0, 0, 0};
  int64_t s = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    shape[size_t(i)] = t.shape[i];
    stride[size_t(i)] = t.strides ? t.strides[i] : s;
    s *= t.shape[i];
  }
  if (want_ndim == 3) stride[3] = 1;
  if (swap12) {
    std::swap(shape[1], shape[2]);
    std::swap(stride[1], stride[2]);
  }
  a.view.shape = shape;
  a.view.stride = stride;
}

// `layout`: 0 [B, L, H, D], 1 [B, H, L, D] (4-D arguments only).
void load(Arg& a, nb::handle obj, const char* name, int want_ndim, bool writable, int layout) {
  const bool swap12 = want_ndim == 4 && layout == 1;
  if (const DLPackExchangeAPI* api = exchange_api(Py_TYPE(obj.ptr()))) {
    nb::dlpack::dltensor t;
    if (api->dltensor_from_py_object_no_sync(obj.ptr(), &t) != 0) nb::raise_python_error();
    a.api = api;
    fill(a, t, name, want_ndim, swap12);
    return;
  }
  // Everything else: nanobind's import (__dlpack__ / buffer protocol), no conversion, any strides.
  auto take = [&](const auto& arr) {
    nb::dlpack::dltensor t;
    t.data = const_cast<void*>(static_cast<const void*>(arr.data()));
    t.device.device_type = int32_t(arr.device_type());
    t.device.device_id = int32_t(arr.device_id());
    t.ndim = int32_t(arr.ndim());
    t.dtype = arr.dtype();
    t.shape = const_cast<int64_t*>(arr.shape_ptr());
    t.strides = const_cast<int64_t*>(arr.stride_ptr());
    t.byte_offset = 0;
    fill(a, t, name, want_ndim, swap12);
  };
  const std::string why = std::string(name) + ": expected " + (writable ? "a writable" : "an") +
                          " array with __dlpack__ or the buffer protocol, got " + nb::type_name(obj.type()).c_str();
  if (writable) {
    a.keep.emplace();
    if (!nb::try_cast(obj, *a.keep, false)) throw nb::type_error(why.c_str());
    take(*a.keep);
  } else {
    a.keep_ro.emplace();
    if (!nb::try_cast(obj, *a.keep_ro, false)) throw nb::type_error(why.c_str());
    take(*a.keep_ro);
  }
}

// One integer tensor of a run-time mask (int32 or int64, 1 to 4 dimensions) as a spattn::IndexView.
struct IndexArg {
  spattn::IndexView view;
  int32_t device_type = kDLCPU, device_id = 0;
  std::optional<nb::ndarray<nb::ro>> keep;
};

void load_index(IndexArg& a, nb::handle obj, const char* name) {
  auto take = [&](const nb::dlpack::dltensor& t) {
    if (t.dtype.code != 0 || (t.dtype.bits != 32 && t.dtype.bits != 64) || t.dtype.lanes != 1)
      throw spattn::Error(std::string(name) + " has dtype " + dtype_text(t.dtype) + ", expected int32 or int64");
    if (t.ndim < 1 || t.ndim > 4)
      throw spattn::Error(std::string(name) + " has " + std::to_string(t.ndim) + " dimensions, expected 1 to 4");
    a.view.data = static_cast<const char*>(t.data) + t.byte_offset;
    a.view.bits = t.dtype.bits;
    a.view.ndim = t.ndim;
    int64_t s = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      a.view.shape[size_t(i)] = t.shape[i];
      a.view.stride[size_t(i)] = t.strides ? t.strides[i] : s;
      s *= t.shape[i];
    }
    a.device_type = t.device.device_type;
    a.device_id = t.device.device_id;
  };
  if (const DLPackExchangeAPI* api = exchange_api(Py_TYPE(obj.ptr()))) {
    nb::dlpack::dltensor t;
    if (api->dltensor_from_py_object_no_sync(obj.ptr(), &t) != 0) nb::raise_python_error();
    take(t);
    return;
  }
  a.keep.emplace();
  if (!nb::try_cast(obj, *a.keep, false))
    throw nb::type_error((std::string(name) + ": expected an integer array with __dlpack__ or the buffer protocol, got " +
                          nb::type_name(obj.type()).c_str())
                             .c_str());
  nb::dlpack::dltensor t;
  t.data = const_cast<void*>(a.keep->data());
  t.device.device_type = int32_t(a.keep->device_type());
  t.device.device_id = int32_t(a.keep->device_id());
  t.ndim = int32_t(a.keep->ndim());
  t.dtype = a.keep->dtype();
  t.shape = const_cast<int64_t*>(a.keep->shape_ptr());
  t.strides = const_cast<int64_t*>(a.keep->stride_ptr());
  t.byte_offset = 0;
  take(t);
}

int parse_layout(const std::string& layout) {
  if (layout == "blhd" || layout == "bshd" || layout.empty()) return 0;
  if (layout == "bhld" || layout == "bhsd") return 1;
  throw spattn::Error("layout '" + layout + "': expected 'blhd' ([B, L, H, D]) or 'bhld' ([B, H, L, D])");
}

// ---- Plan --------------------------------------------------------------------------------------------
struct PyPlan {
  spattn::Plan plan;
  std::string spec;  // the pattern(s) it was built from, for repr

  // The arrays of one call, checked to live on the plan's device; returns the stream to use.
  spattn::Stream check_devices(std::initializer_list<std::pair<const Arg*, const char*>> args,
                               const nb::object& stream) const {
    const spattn::Device& dev = plan.device();
    const bool cuda = dev.kind == spattn::Device::Kind::cuda;
    const DLPackExchangeAPI* api = nullptr;
    for (const auto& [a, name] : args) {
      if (!a) continue;
      const bool ok = cuda ? ((a->device_type == kDLCUDA || a->device_type == kDLCUDAManaged) && a->device_id == dev.index)
                           : (a->device_type == kDLCPU || a->device_type == kDLCUDAHost);
      if (!ok)
        throw spattn::Error(std::string(name) + " is on " + device_text(a->device_type, a->device_id) +
                            ", the plan runs on " + dev.str());
      if (!api) api = a->api;
    }
    if (!stream.is_none()) return reinterpret_cast<spattn::Stream>(nb::cast<uintptr_t>(stream));
    // No stream given: the producer's current stream where it tells (torch.cuda.current_stream()), else the
    // legacy default stream.
    if (cuda && api && api->current_work_stream) {
      void* s = nullptr;
      if (api->current_work_stream(kDLCUDA, dev.index, &s) != 0) nb::raise_python_error();
      return s;
    }
    return nullptr;
  }

  // The arrays of one forward call, loaded and checked.
  struct ForwardArgs {
    Arg q, k, v, o, lse;
    bool has_lse = false;
    spattn::Stream stream = nullptr;
    spattn::TensorView lse_view() const { return has_lse ? lse.view : spattn::TensorView{}; }
  };
  void load_forward(ForwardArgs& f, nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse,
                    const nb::object& stream, const std::string& layout) const {
    const int lay = parse_layout(layout);
    load(f.q, q, "q", 4, false, lay);
    load(f.k, k, "k", 4, false, lay);
    load(f.v, v, "v", 4, false, lay);
    load(f.o, o, "o", 4, true, lay);
    f.has_lse = !lse.is_none();
    if (f.has_lse) load(f.lse, lse, "lse", 3, true, lay);
    f.stream = check_devices(
        {{&f.q, "q"}, {&f.k, "k"}, {&f.v, "v"}, {&f.o, "o"}, {f.has_lse ? &f.lse : nullptr, "lse"}}, stream);
  }

  void forward(nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse, const nb::object& stream,
               const std::string& layout) const {
    ForwardArgs f;
    load_forward(f, q, k, v, o, lse, stream, layout);
    nb::gil_scoped_release unlocked;
    plan.forward(f.q.view, f.k.view, f.v.view, f.o.view, f.lse_view(), f.stream);
  }

  void backward(nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse, nb::handle dout,
                nb::handle dq, nb::handle dk, nb::handle dv, const nb::object& stream, const std::string& layout) const {
    run_backward(q, k, v, o, lse, dout, dq, dk, dv, stream, layout, nullptr);
  }
  // backward, with the call's run-time mask where `mask` is not null.
  void run_backward(nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse, nb::handle dout,
                    nb::handle dq, nb::handle dk, nb::handle dv, const nb::object& stream, const std::string& layout,
                    const spattn::RuntimeMask* mask) const {
    const int lay = parse_layout(layout);
    Arg aq, ak, av, ao, al, ad, adq, adk, adv;
    load(aq, q, "q", 4, false, lay);
    load(ak, k, "k", 4, false, lay);
    load(av, v, "v", 4, false, lay);
    const bool has_o = !o.is_none(), has_lse = !lse.is_none();  // the CPU engines recompute the softmax
    if (has_o) load(ao, o, "o", 4, false, lay);
    if (has_lse) load(al, lse, "lse", 3, false, lay);
    load(ad, dout, "dout", 4, false, lay);
    load(adq, dq, "dq", 4, true, lay);
    load(adk, dk, "dk", 4, true, lay);
    load(adv, dv, "dv", 4, true, lay);
    const spattn::Stream s = check_devices({{&aq, "q"}, {&ak, "k"}, {&av, "v"}, {has_o ? &ao : nullptr, "o"},
                                            {has_lse ? &al : nullptr, "lse"}, {&ad, "dout"}, {&adq, "dq"},
                                            {&adk, "dk"}, {&adv, "dv"}},
                                           stream);
    nb::gil_scoped_release unlocked;
    const spattn::TensorView none{};
    if (mask)
      plan.backward(aq.view, ak.view, av.view, has_o ? ao.view : none, has_lse ? al.view : none, ad.view, adq.view,
                    adk.view, adv.view, *mask, s);
    else
      plan.backward(aq.view, ak.view, av.view, has_o ? ao.view : none, has_lse ? al.view : none, ad.view, adq.view,
                    adk.view, adv.view, s);
  }

  // Mean seconds of one C++ Plan::forward on these arrays, timed in C++ over `iters` calls: the baseline
  // that the Python and torch paths' host overhead is measured against (bench/python_overhead.py).
  double time_forward(nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse, int iters,
                      const std::string& layout) const {
    ForwardArgs f;
    load_forward(f, q, k, v, o, lse, nb::none(), layout);
    nb::gil_scoped_release unlocked;
    plan.forward(f.q.view, f.k.view, f.v.view, f.o.view, f.lse_view(), f.stream);  // warm
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) plan.forward(f.q.view, f.k.view, f.v.view, f.o.view, f.lse_view(), f.stream);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / std::max(iters, 1);
  }

  // The run-time mask of one call (spattn/runtime_mask.hpp): `mask` holds the 7 slots (None where absent), each
  // checked to live where the plan runs (CPU plans also take them from CUDA host memory).
  struct MaskArgs {
    std::array<IndexArg, spattn::RuntimeMask::kSlots> args;
    spattn::RuntimeMask mask;
  };
  void load_mask(MaskArgs& m, const std::vector<nb::object>& mask, bool check, bool no_host) const {
    if (mask.size() != size_t(spattn::RuntimeMask::kSlots))
      throw spattn::Error("mask: expected " + std::to_string(spattn::RuntimeMask::kSlots) + " slots, got " +
                          std::to_string(mask.size()));
    const spattn::Device& dev = plan.device();
    const bool cuda = dev.kind == spattn::Device::Kind::cuda;
    for (int i = 0; i < spattn::RuntimeMask::kSlots; ++i) {
      if (mask[size_t(i)].is_none()) continue;
      const char* name = spattn::RuntimeMask::kSlotNames[size_t(i)];
      IndexArg& a = m.args[size_t(i)];
      load_index(a, mask[size_t(i)], name);
      const bool ok = cuda ? ((a.device_type == kDLCUDA || a.device_type == kDLCUDAManaged) && a.device_id == dev.index)
                           : (a.device_type == kDLCPU || a.device_type == kDLCUDAHost);
      if (!ok)
        throw spattn::Error(std::string(name) + " is on " + device_text(a.device_type, a.device_id) + ", the plan runs on " +
                            dev.str());
      m.mask.slot(i) = a.view;
    }
    m.mask.check = check;
    m.mask.no_host = no_host;
  }

  void forward_mask(nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse,
                    const std::vector<nb::object>& mask, bool check, const nb::object& stream,
                    const std::string& layout, bool no_host) const {
    ForwardArgs f;
    load_forward(f, q, k, v, o, lse, stream, layout);
    MaskArgs m;
    load_mask(m, mask, check, no_host);
    nb::gil_scoped_release unlocked;
    plan.forward(f.q.view, f.k.view, f.v.view, f.o.view, f.lse_view(), m.mask, f.stream);
  }

  void backward_mask(nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse, nb::handle dout,
                     nb::handle dq, nb::handle dk, nb::handle dv, const std::vector<nb::object>& mask, bool check,
                     const nb::object& stream, const std::string& layout, bool no_host) const {
    MaskArgs m;
    load_mask(m, mask, check, no_host);
    run_backward(q, k, v, o, lse, dout, dq, dk, dv, stream, layout, &m.mask);
  }
};

const char* dtype_py(spattn::DType t) {
  switch (t) {
    case spattn::DType::f32: return "float32";
    case spattn::DType::f16: return "float16";
    case spattn::DType::bf16: return "bfloat16";
    case spattn::DType::f64: return "float64";
  }
  return "?";
}

// The dtype a plan's forward writes O in: the CPU engine fp32; the reference fp64 for fp64 problems (fp32
// otherwise); the GPU engines the problem's dtype.
spattn::DType out_dtype(const spattn::Plan& p) {
  switch (p.engine()) {
    case spattn::Engine::cpu_fused: return spattn::DType::f32;
    case spattn::Engine::reference: return p.problem().dtype == spattn::DType::f64 ? spattn::DType::f64 : spattn::DType::f32;
    default: return p.problem().dtype;
  }
}
// The dtype backward writes dQ, dK, dV in: the CPU engines fp32 (fp64 for fp64 problems); the GPU engines the
// problem's dtype.
spattn::DType grad_dtype(const spattn::Plan& p) {
  if (p.device().kind == spattn::Device::Kind::cpu)
    return p.problem().dtype == spattn::DType::f64 ? spattn::DType::f64 : spattn::DType::f32;
  return p.problem().dtype;
}
spattn::DType lse_dtype(const spattn::Plan& p) {
  return p.engine() == spattn::Engine::reference && p.problem().dtype == spattn::DType::f64 ? spattn::DType::f64
                                                                                          : spattn::DType::f32;
}

spattn::PlanOptions make_options(const std::string& engine, const std::string& kernel, int threads, int block_m,
                                 int block_n, int perm_d, int persistent, int split, int compound, int tile_map) {
  spattn::PlanOptions o;
  o.engine = spattn::parse_engine(engine.empty() ? "auto" : engine);
  o.kernel = kernel;
  o.threads = threads;
  o.block_m = block_m, o.block_n = block_n, o.perm_d = perm_d, o.persistent = persistent, o.split = split;
  o.compound = compound;
  o.tile_map = tile_map;
  return o;
}

spattn::Problem make_problem(int64_t batch, int64_t heads, int64_t kv_heads, int64_t q_len, int64_t k_len,
                             int64_t head_dim, int64_t value_dim, const std::string& dtype, std::optional<double> scale) {
  spattn::Problem p;
  p.batch = batch, p.q_heads = heads, p.kv_heads = kv_heads, p.q_len = q_len, p.kv_len = k_len;
  p.head_dim = head_dim, p.value_dim = value_dim, p.dtype = spattn::parse_dtype(dtype), p.scale = scale;
  return p;
}

// A [q_len, k_len] numpy bool array of the pattern's kept pairs.
nb::ndarray<nb::numpy, bool, nb::ndim<2>> dense_mask(const spattn::BoundPattern& bp) {
  const int64_t rows = bp.q_len(), cols = bp.k_len();
  auto* buf = new bool[size_t(std::max<int64_t>(rows * cols, 1))]();
  nb::capsule owner(buf, [](void* p) noexcept { delete[] static_cast<bool*>(p); });
  {
    nb::gil_scoped_release unlocked;
    std::vector<int64_t> keys;
    for (int64_t q = 0; q < rows; ++q) {
      bp.row_keys(q, keys);
      bool* row = buf + q * cols;
      for (int64_t k : keys) row[k] = true;
    }
  }
  return nb::ndarray<nb::numpy, bool, nb::ndim<2>>(buf, {size_t(rows), size_t(cols)}, owner);
}

}  // namespace

void bind_tsvd(nb::module_& m);  // python/src/tsvd.cpp

namespace {
// Ranges as a list of (begin, end) pairs and back.
nb::list ranges_py(const spattn::IndexRanges& r) {
  nb::list out;
  for (const spattn::IndexRange& x : r) out.append(nb::make_tuple(x.begin, x.end));
  return out;
}
spattn::IndexRanges ranges_cpp(const std::vector<std::pair<int64_t, int64_t>>& r) {
  spattn::IndexRanges out;
  for (const auto& [b, e] : r) out.push_back({b, e});
  return out;
}
}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "spattn's compiled core (use the `spattn` package, not this module)";
  nb::exception<spattn::Error>(m, "Error", PyExc_ValueError);
  bind_tsvd(m);

  m.def(
      "build_info",
      [] {
        nb::dict d;
        d["version"] = SPATTN_VERSION;
        d["cuda"] = bool(SPATTN_HAVE_CUDA);
        d["cuda_archs"] = SPATTN_CUDA_ARCHS;
        d["build_type"] = SPATTN_BUILD_TYPE;
        std::string why;
        d["gpus"] = int(spattn::list_gpus(&why).size());
        return d;
      },
      "Version and build options of this spattn build, and how many GPUs it sees.");

  nb::class_<spattn::Pattern>(m, "Pattern")
      .def("__init__", [](spattn::Pattern* self, const std::string& spec) { new (self) spattn::Pattern(spattn::parse(spec)); },
           "spec"_a, "Parses a pattern spec (docs/PATTERNS.md); raises spattn.Error naming the column of a syntax error.")
      .def_prop_ro("spec", &spattn::Pattern::spec)
      .def("__repr__", [](const spattn::Pattern& p) { return "spattn.Pattern('" + p.spec() + "')"; })
      .def("__str__", &spattn::Pattern::spec)
      .def("__eq__", [](const spattn::Pattern& a, nb::handle b) {
             return nb::isinstance<spattn::Pattern>(b) && a.spec() == nb::cast<const spattn::Pattern&>(b).spec();
           })
      .def("__hash__", [](const spattn::Pattern& p) { return nb::hash(nb::str(p.spec().c_str())); })
      .def("nnz", [](const spattn::Pattern& p, int64_t q_len, int64_t k_len) { return p.bind(q_len, k_len).nnz(); },
           "q_len"_a, "k_len"_a, "Kept (q, k) pairs at these lengths.")
      .def("row", [](const spattn::Pattern& p, int64_t q, int64_t q_len, int64_t k_len) {
             const spattn::BoundPattern bp = p.bind(q_len, k_len);
             if (q < 0 || q >= q_len) throw spattn::Error("row " + std::to_string(q) + " is outside [0, " + std::to_string(q_len) + ")");
             std::vector<int64_t> keys;
             bp.row_keys(q, keys);
             return keys;
           },
           "q"_a, "q_len"_a, "k_len"_a, "The keys of query row q, increasing.")
      .def("mask", [](const spattn::Pattern& p, int64_t q_len, int64_t k_len) { return dense_mask(p.bind(q_len, k_len)); },
           "q_len"_a, "k_len"_a, "The [q_len, k_len] boolean mask (True: kept).");

  nb::class_<PyPlan>(m, "Plan")
      .def_prop_ro("batch", [](const PyPlan& p) { return p.plan.problem().batch; })
      .def_prop_ro("heads", [](const PyPlan& p) { return p.plan.problem().q_heads; })
      .def_prop_ro("kv_heads", [](const PyPlan& p) { return p.plan.problem().kv_heads; })
      .def_prop_ro("q_len", [](const PyPlan& p) { return p.plan.problem().q_len; })
      .def_prop_ro("k_len", [](const PyPlan& p) { return p.plan.problem().kv_len; })
      .def_prop_ro("head_dim", [](const PyPlan& p) { return p.plan.problem().head_dim; })
      .def_prop_ro("value_dim", [](const PyPlan& p) { return p.plan.problem().dv(); })
      .def_prop_ro("dtype", [](const PyPlan& p) { return dtype_py(p.plan.problem().dtype); })
      .def_prop_ro("scale", [](const PyPlan& p) { return p.plan.problem().softmax_scale(); })
      .def_prop_ro("device", [](const PyPlan& p) { return p.plan.device().str(); })
      .def_prop_ro("engine", [](const PyPlan& p) { return std::string(spattn::engine_name(p.plan.engine())); })
      .def_prop_ro("out_dtype", [](const PyPlan& p) { return dtype_py(out_dtype(p.plan)); })
      .def_prop_ro("lse_dtype", [](const PyPlan& p) { return dtype_py(lse_dtype(p.plan)); })
      .def_prop_ro("grad_dtype", [](const PyPlan& p) { return dtype_py(grad_dtype(p.plan)); })
      .def_prop_ro("spec", [](const PyPlan& p) { return p.spec; })
      .def_prop_ro("plan_ms", [](const PyPlan& p) { return p.plan.plan_ms(); })
      .def("nnz", [](const PyPlan& p) { return p.plan.nnz(); })
      .def("kernel", [](const PyPlan& p) { return p.plan.kernel(); })
      .def("last_kernel", [](const PyPlan& p) { return p.plan.last_kernel(); })
      .def("last_backward_kernel", [](const PyPlan& p) { return p.plan.last_backward_kernel(); })
      .def("explain", [](const PyPlan& p) { return p.plan.explain(); })
      .def("forward", &PyPlan::forward, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a.none(), "stream"_a.none() = nb::none(),
           "layout"_a = "blhd")
      .def("backward", &PyPlan::backward, "q"_a, "k"_a, "v"_a, "o"_a.none(), "lse"_a.none(), "dout"_a, "dq"_a, "dk"_a, "dv"_a,
           "stream"_a.none() = nb::none(), "layout"_a = "blhd")
      .def_prop_ro("mask", [](const PyPlan& p) { return p.plan.takes_mask() ? p.spec : std::string(); })
      .def("forward_mask", &PyPlan::forward_mask, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a.none(), "mask"_a, "check"_a = false,
           "stream"_a.none() = nb::none(), "layout"_a = "blhd", "no_host"_a = false)
      .def("backward_mask", &PyPlan::backward_mask, "q"_a, "k"_a, "v"_a, "o"_a.none(), "lse"_a.none(), "dout"_a, "dq"_a,
           "dk"_a, "dv"_a, "mask"_a, "check"_a = false, "stream"_a.none() = nb::none(), "layout"_a = "blhd",
           "no_host"_a = false)
      .def("time_forward", &PyPlan::time_forward, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a.none(), "iters"_a,
           "layout"_a = "blhd");

  m.def(
      "make_plan",
      [](const std::vector<spattn::Pattern>& patterns, int64_t batch, int64_t heads, int64_t kv_heads, int64_t q_len,
         int64_t k_len, int64_t head_dim, int64_t value_dim, const std::string& dtype, std::optional<double> scale,
         const std::string& device, const std::string& engine, const std::string& kernel, int threads, int block_m,
         int block_n, int perm_d, int persistent, int split, int compound, int tile_map) {
        const spattn::Problem pr = make_problem(batch, heads, kv_heads, q_len, k_len, head_dim, value_dim, dtype, scale);
        const spattn::PlanOptions o = make_options(engine, kernel, threads, block_m, block_n, perm_d, persistent, split, compound, tile_map);
        const spattn::Device dev = spattn::Device::parse(device);
        auto p = std::make_unique<PyPlan>();
        for (const auto& pat : patterns) p->spec += (p->spec.empty() ? "" : "; ") + pat.spec();
        nb::gil_scoped_release unlocked;
        p->plan = spattn::make_plan(patterns, pr, dev, o);
        return p.release();
      },
      "patterns"_a, "batch"_a, "heads"_a, "kv_heads"_a, "q_len"_a, "k_len"_a, "head_dim"_a, "value_dim"_a, "dtype"_a,
      "scale"_a, "device"_a, "engine"_a, "kernel"_a, "threads"_a, "block_m"_a, "block_n"_a, "perm_d"_a, "persistent"_a,
      "split"_a, "compound"_a, "tile_map"_a, nb::rv_policy::take_ownership);

  m.def(
      "make_masked_plan",
      [](const std::string& mask, int64_t batch, int64_t heads, int64_t kv_heads, int64_t q_len, int64_t k_len,
         int64_t head_dim, int64_t value_dim, const std::string& dtype, std::optional<double> scale, const std::string& device,
         const std::string& engine, const std::string& kernel, int threads) {
        const spattn::Problem pr = make_problem(batch, heads, kv_heads, q_len, k_len, head_dim, value_dim, dtype, scale);
        const spattn::PlanOptions o = make_options(engine, kernel, threads, 0, 0, -1, -1, -1, -1, -1);
        const spattn::MaskLayout layout = spattn::MaskLayout::parse(mask);
        auto p = std::make_unique<PyPlan>();
        p->spec = layout.str();
        nb::gil_scoped_release unlocked;
        p->plan = spattn::make_plan(layout, pr, spattn::Device::parse(device), o);
        return p.release();
      },
      "mask"_a, "batch"_a, "heads"_a, "kv_heads"_a, "q_len"_a, "k_len"_a, "head_dim"_a, "value_dim"_a, "dtype"_a,
      "scale"_a, "device"_a, "engine"_a, "kernel"_a, "threads"_a, nb::rv_policy::take_ownership,
      "A plan whose mask comes at every call (spattn/runtime_mask.hpp): `mask` is the layout's text "
      "(blocks:QBxKB[:SPEC], documents[:SPEC], topk:K[:SPEC]).");

  m.def(
      "dist_schedule",
      [](const std::vector<spattn::Pattern>& patterns, int64_t len, int world, const std::string& layout, int64_t batch,
         int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t value_dim, const std::string& dtype,
         int64_t key_block, bool distribute_rows) {
        const spattn::Problem pr = make_problem(batch, heads, kv_heads, len, len, head_dim, value_dim, dtype, 0);
        const spattn::dist::DistPlan plan(patterns, pr, spattn::dist::ShardLayout::parse(layout, len, world),
                                          {.key_block = key_block, .distribute_rows = distribute_rows});
        nb::list ranks;
        for (int r = 0; r < world; ++r) {
          const spattn::dist::RankPlan& rp = plan.rank(r);
          nb::dict d;
          d["owned"] = ranges_py(rp.owned);
          d["fetched"] = ranges_py(rp.fetched);
          nb::list recv, send;
          for (int s = 0; s < world; ++s) {
            recv.append(ranges_py(rp.recv_keys[size_t(s)]));
            send.append(ranges_py(rp.send_keys[size_t(s)]));
          }
          d["recv_keys"] = recv;
          d["send_keys"] = send;
          d["skipped"] = ranges_py(rp.skipped);
          d["boundary_keys"] = rp.boundary_keys;
          d["boundary_bytes"] = rp.boundary_bytes;
          d["kv_recv_bytes"] = rp.kv_recv_bytes;
          d["recv_bytes"] = rp.recv_bytes;
          d["send_bytes"] = rp.send_bytes;
          ranks.append(d);
        }
        return nb::make_tuple(plan.explain(), ranks);
      },
      "patterns"_a, "len"_a, "world"_a, "layout"_a, "batch"_a, "heads"_a, "kv_heads"_a, "head_dim"_a, "value_dim"_a,
      "dtype"_a, "key_block"_a, "distribute_rows"_a,
      "The distributed plan's exchange schedule (spattn/distributed.hpp): (explain, one dict per rank).");

  m.def(
      "make_window_plan",
      [](const std::vector<spattn::Pattern>& patterns, int64_t len, const std::vector<std::pair<int64_t, int64_t>>& rows,
         const std::vector<std::pair<int64_t, int64_t>>& keys, const std::vector<std::pair<int64_t, int64_t>>& skip,
         int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t value_dim, const std::string& dtype,
         std::optional<double> scale, const std::string& device, const std::string& engine, int threads) {
        const spattn::IndexRanges r = ranges_cpp(rows), k = ranges_cpp(keys), sk = ranges_cpp(skip);
        std::vector<spattn::BoundPattern> windows;
        for (const auto& p : patterns) windows.push_back(spattn::BoundPattern::window(p.bind(len, len), r, k, sk));
        const spattn::Problem pr =
            make_problem(batch, heads, kv_heads, spattn::total_size(r), spattn::total_size(k), head_dim, value_dim, dtype, scale);
        const spattn::PlanOptions o = make_options(engine, "", threads, 0, 0, -1, -1, -1, -1, -1);
        auto p = std::make_unique<PyPlan>();
        p->spec = windows[0].spec();
        nb::gil_scoped_release unlocked;
        p->plan = spattn::make_plan(windows, pr, spattn::Device::parse(device), o);
        return p.release();
      },
      "patterns"_a, "len"_a, "rows"_a, "keys"_a, "skip"_a, "batch"_a, "heads"_a, "kv_heads"_a, "head_dim"_a,
      "value_dim"_a, "dtype"_a, "scale"_a, "device"_a, "engine"_a, "threads"_a, nb::rv_policy::take_ownership,
      "A plan over a window of the patterns bound to (len, len): query rows `rows`, keys `keys` (lists of (begin, end)),"
      " rows in `skip` kept empty (BoundPattern::window).");

  m.def(
      "merge_into",
      [](nb::handle o, nb::handle lse, nb::handle o2, nb::handle lse2) {
        Arg ao, al, ao2, al2;
        load(ao, o, "o", 4, true, 0);
        load(al, lse, "lse", 3, true, 0);
        load(ao2, o2, "o2", 4, false, 0);
        load(al2, lse2, "lse2", 3, false, 0);
        for (const auto& [a, name] : {std::pair{&ao, "o"}, {&al, "lse"}, {&ao2, "o2"}, {&al2, "lse2"}})
          if (a->device_type != kDLCPU)
            throw spattn::Error(std::string("merge_into: ") + name + " is on " + device_text(a->device_type, a->device_id) +
                                "; the merge runs on CPU memory only for now");
        nb::gil_scoped_release unlocked;
        spattn::dist::merge_into(ao.view, al.view, ao2.view, al2.view);
      },
      "o"_a, "lse"_a, "o2"_a, "lse2"_a,
      "(o, lse) <- the LSE merge of (o, lse) and (o2, lse2) (o [B, L, H, D], lse [B, H, L]; CPU).");

  m.def(
      "make_plan_csr",
      [](nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> row_offsets,
         nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> col_indices, int64_t batch, int64_t heads,
         int64_t kv_heads, int64_t q_len, int64_t k_len, int64_t head_dim, int64_t value_dim, const std::string& dtype,
         std::optional<double> scale, const std::string& device, const std::string& engine, const std::string& kernel, int threads,
         int block_m, int block_n, int perm_d, int persistent, int split, int compound, int tile_map) {
        spattn::Csr csr;
        csr.rows = q_len, csr.cols = k_len;
        csr.row_offsets.assign(row_offsets.data(), row_offsets.data() + row_offsets.shape(0));
        csr.col_indices.assign(col_indices.data(), col_indices.data() + col_indices.shape(0));
        const spattn::Problem pr = make_problem(batch, heads, kv_heads, q_len, k_len, head_dim, value_dim, dtype, scale);
        const spattn::PlanOptions o = make_options(engine, kernel, threads, block_m, block_n, perm_d, persistent, split, compound, tile_map);
        const spattn::Device dev = spattn::Device::parse(device);
        auto p = std::make_unique<PyPlan>();
        p->spec = "mask (" + std::to_string(q_len) + " x " + std::to_string(k_len) + ", nnz " + std::to_string(csr.nnz()) + ")";
        nb::gil_scoped_release unlocked;
        p->plan = spattn::make_plan(csr, pr, dev, o);
        return p.release();
      },
      "row_offsets"_a, "col_indices"_a, "batch"_a, "heads"_a, "kv_heads"_a, "q_len"_a, "k_len"_a, "head_dim"_a,
      "value_dim"_a, "dtype"_a, "scale"_a, "device"_a, "engine"_a, "kernel"_a, "threads"_a, "block_m"_a, "block_n"_a,
      "perm_d"_a, "persistent"_a, "split"_a, "compound"_a, "tile_map"_a, nb::rv_policy::take_ownership);
}
