// cuSPARSE SDDMM / SpMM anchor (see the header).
#include "bench/cusparse_baseline.hpp"

#include <cuda_runtime.h>
#include <cusparse.h>

#include <cstring>
#include <random>
#include <vector>

#include "cuda/common/check.hpp"

namespace spattn::bench {

namespace {
void cs_check(cusparseStatus_t s, const char* what) {
  if (s != CUSPARSE_STATUS_SUCCESS)
    throw Error(std::string("cuSPARSE error in ") + what + ": " + cusparseGetErrorString(s));
}
#define CS(expr) cs_check((expr), #expr)
#define CU(expr) SPATTN_CUDA_CHECK(expr)

cudaDataType cuda_type(DType t) {
  switch (t) {
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}
const char* type_name(cudaDataType t) {
  return t == CUDA_R_16BF ? "bf16" : t == CUDA_R_16F ? "f16" : "f32";
}

void* dev_alloc(size_t bytes) {
  void* p = nullptr;
  CU(cudaMalloc(&p, std::max<size_t>(bytes, 256)));
  return p;
}
}  // namespace

struct CusparseBaseline::Impl {
  cusparseHandle_t handle = nullptr;
  int64_t nb = 0, Lq = 0, Lk = 0, D = 0, Dv = 0, nnz = 0;
  DType in_dtype = DType::bf16;
  bool batched = true;        // SDDMM
  bool spmm_batched = true;
  cudaDataType ab_sddmm = CUDA_R_32F, ab_spmm = CUDA_R_32F, c_spmm = CUDA_R_32F;
  std::vector<void*> allocs;
  // Head-major copies, in the input dtype and (lazily) fp32.
  void *qh = nullptr, *kh = nullptr, *vh = nullptr, *qh32 = nullptr, *kh32 = nullptr, *vh32 = nullptr;
  int32_t *offsets = nullptr, *cols = nullptr;
  float* s = nullptr;                    // [nb][nnz]
  void *p = nullptr, *o = nullptr;       // P [nb][nnz] (ab_spmm), O [nb][Lq][Dv] (c_spmm)
  void *buf_sddmm = nullptr, *buf_spmm = nullptr;
  cusparseDnMatDescr_t A = nullptr, B = nullptr, Vd = nullptr, Od = nullptr;
  cusparseSpMatDescr_t Sm = nullptr, Pm = nullptr;

  void* alloc(size_t bytes) {
    void* ptr = dev_alloc(bytes);
    allocs.push_back(ptr);
    return ptr;
  }
  ~Impl() {
    for (auto d : {A, B, Vd, Od})
      if (d) cusparseDestroyDnMat(d);
    for (auto m : {Sm, Pm})
      if (m) cusparseDestroySpMat(m);
    if (handle) cusparseDestroy(handle);
    for (void* ptr : allocs) cudaFree(ptr);
  }
};

namespace {
// [B, L, H, D] (device) -> [B*H][L][D] (device), element size es.
void to_head_major(void* dst, const void* src, int64_t B, int64_t L, int64_t H, int64_t D, int es) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      CU(cudaMemcpy2D(static_cast<char*>(dst) + ((b * H + h) * L * D) * es, size_t(D * es),
                      static_cast<const char*>(src) + ((b * L * H + h) * D) * es, size_t(H * D * es), size_t(D * es),
                      size_t(L), cudaMemcpyDeviceToDevice));
}
void* to_f32(CusparseBaseline::Impl& I, const void* src, int64_t n, DType t) {
  if (t == DType::f32) return const_cast<void*>(src);
  std::vector<uint16_t> h(static_cast<size_t>(n));
  CU(cudaMemcpy(h.data(), src, size_t(n) * 2, cudaMemcpyDeviceToHost));
  std::vector<float> f(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) f[size_t(i)] = t == DType::bf16 ? bf16_to_float(h[size_t(i)]) : half_to_float(h[size_t(i)]);
  void* d = I.alloc(size_t(n) * 4);
  CU(cudaMemcpy(d, f.data(), size_t(n) * 4, cudaMemcpyHostToDevice));
  return d;
}
}  // namespace

CusparseBaseline::CusparseBaseline(const Csr& csr, const Problem& pr, const void* q, const void* k, const void* v)
    : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  if (pr.q_heads != pr.kv_heads) throw Error("cusparse baseline: grouped-query heads are not supported");
  I.nb = pr.batch * pr.q_heads;
  I.Lq = pr.q_len;
  I.Lk = pr.kv_len;
  I.D = pr.head_dim;
  I.Dv = pr.dv();
  I.nnz = csr.nnz();
  I.in_dtype = pr.dtype;
  if (I.nnz >= (int64_t(1) << 31)) throw Error("cusparse baseline: nnz " + std::to_string(I.nnz) + " needs 64-bit indices");
  const int es = dtype_size(pr.dtype);
  CS(cusparseCreate(&I.handle));

  I.qh = I.alloc(size_t(I.nb * I.Lq * I.D * es));
  I.kh = I.alloc(size_t(I.nb * I.Lk * I.D * es));
  I.vh = I.alloc(size_t(I.nb * I.Lk * I.Dv * es));
  to_head_major(I.qh, q, pr.batch, I.Lq, pr.q_heads, I.D, es);
  to_head_major(I.kh, k, pr.batch, I.Lk, pr.q_heads, I.D, es);
  to_head_major(I.vh, v, pr.batch, I.Lk, pr.q_heads, I.Dv, es);

  // Batched needs the column indices repeated per head (cuSPARSE has one batch stride for columns and
  // values); past 1.5 GB of copies, loop over heads instead.
  I.batched = I.nnz * I.nb * 4 <= (int64_t(3) << 29);
  const int64_t reps = I.batched ? I.nb : 1;
  std::vector<int32_t> off(csr.row_offsets.begin(), csr.row_offsets.end());
  I.offsets = static_cast<int32_t*>(I.alloc(off.size() * 4));
  CU(cudaMemcpy(I.offsets, off.data(), off.size() * 4, cudaMemcpyHostToDevice));
  I.cols = static_cast<int32_t*>(I.alloc(size_t(I.nnz * reps) * 4));
  for (int64_t r = 0; r < reps; ++r)
    CU(cudaMemcpy(I.cols + r * I.nnz, csr.col_indices.data(), size_t(I.nnz) * 4, cudaMemcpyHostToDevice));
  I.s = static_cast<float*>(I.alloc(size_t(I.nb * I.nnz) * 4));
  CU(cudaMemset(I.s, 0, size_t(I.nb * I.nnz) * 4));

  // ---- SDDMM: try the input dtype (fp32 compute), else fp32 copies -------------------------------------
  auto make_sddmm = [&](cudaDataType ab, void* qd, void* kd) -> bool {
    if (I.A) cusparseDestroyDnMat(I.A), I.A = nullptr;
    if (I.B) cusparseDestroyDnMat(I.B), I.B = nullptr;
    if (I.Sm) cusparseDestroySpMat(I.Sm), I.Sm = nullptr;
    CS(cusparseCreateDnMat(&I.A, I.Lq, I.D, I.D, qd, ab, CUSPARSE_ORDER_ROW));
    CS(cusparseCreateDnMat(&I.B, I.Lk, I.D, I.D, kd, ab, CUSPARSE_ORDER_ROW));
    CS(cusparseCreateCsr(&I.Sm, I.Lq, I.Lk, I.nnz, I.offsets, I.cols, I.s, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                         CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    if (I.batched) {
      CS(cusparseDnMatSetStridedBatch(I.A, int(I.nb), I.Lq * I.D));
      CS(cusparseDnMatSetStridedBatch(I.B, int(I.nb), I.Lk * I.D));
      CS(cusparseCsrSetStridedBatch(I.Sm, int(I.nb), 0, I.nnz));
    }
    const float one = 1.f, zero = 0.f;
    size_t bytes = 0;
    if (cusparseSDDMM_bufferSize(I.handle, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_TRANSPOSE, &one, I.A,
                                 I.B, &zero, I.Sm, CUDA_R_32F, CUSPARSE_SDDMM_ALG_DEFAULT, &bytes) != CUSPARSE_STATUS_SUCCESS)
      return false;
    I.buf_sddmm = I.alloc(bytes);
    if (cusparseSDDMM_preprocess(I.handle, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_TRANSPOSE, &one, I.A,
                                 I.B, &zero, I.Sm, CUDA_R_32F, CUSPARSE_SDDMM_ALG_DEFAULT, I.buf_sddmm) != CUSPARSE_STATUS_SUCCESS)
      return false;
    I.ab_sddmm = ab;
    return true;
  };
  bool ok = false;
  const bool want_batched = I.batched;
  for (cudaDataType ab : {cuda_type(pr.dtype), CUDA_R_32F}) {
    if (ab == CUDA_R_32F && pr.dtype != DType::f32 && !I.qh32) {
      I.qh32 = to_f32(I, I.qh, I.nb * I.Lq * I.D, pr.dtype);
      I.kh32 = to_f32(I, I.kh, I.nb * I.Lk * I.D, pr.dtype);
    }
    for (bool bat : {want_batched, false}) {
      I.batched = bat;
      if ((ok = make_sddmm(ab, ab == CUDA_R_32F && I.qh32 ? I.qh32 : I.qh, ab == CUDA_R_32F && I.kh32 ? I.kh32 : I.kh)))
        break;
    }
    if (ok) break;
  }
  if (!ok) throw Error("cusparse baseline: cusparseSDDMM refuses every configuration tried");

  // ---- SpMM: P values random in (0, 1), the input dtype first ------------------------------------------
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> uni(0.f, 1.f);
  auto make_spmm = [&](cudaDataType ab, cudaDataType c) -> bool {
    if (I.Pm) cusparseDestroySpMat(I.Pm), I.Pm = nullptr;
    if (I.Vd) cusparseDestroyDnMat(I.Vd), I.Vd = nullptr;
    if (I.Od) cusparseDestroyDnMat(I.Od), I.Od = nullptr;
    const int pes = ab == CUDA_R_32F ? 4 : 2, ces = c == CUDA_R_32F ? 4 : 2;
    // One head of random values, repeated for every head (setup only; cuSPARSE's time does not depend on them).
    std::vector<char> host(size_t(I.nnz) * pes);
    for (int64_t i = 0; i < I.nnz; ++i) {
      const float x = uni(rng) / 64.f;
      if (pes == 4) std::memcpy(&host[size_t(i) * 4], &x, 4);
      else {
        const uint16_t hx = ab == CUDA_R_16BF ? float_to_bf16(x) : float_to_half(x);
        std::memcpy(&host[size_t(i) * 2], &hx, 2);
      }
    }
    I.p = I.alloc(host.size() * size_t(I.nb));
    for (int64_t r = 0; r < I.nb; ++r)
      CU(cudaMemcpy(static_cast<char*>(I.p) + r * int64_t(host.size()), host.data(), host.size(), cudaMemcpyHostToDevice));
    I.o = I.alloc(size_t(I.nb * I.Lq * I.Dv * ces));
    void* vd = ab == CUDA_R_32F && pr.dtype != DType::f32
                   ? (I.vh32 ? I.vh32 : (I.vh32 = to_f32(I, I.vh, I.nb * I.Lk * I.Dv, pr.dtype)))
                   : I.vh;
    CS(cusparseCreateCsr(&I.Pm, I.Lq, I.Lk, I.nnz, I.offsets, I.cols, I.p, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                         CUSPARSE_INDEX_BASE_ZERO, ab));
    CS(cusparseCreateDnMat(&I.Vd, I.Lk, I.Dv, I.Dv, vd, ab, CUSPARSE_ORDER_ROW));
    CS(cusparseCreateDnMat(&I.Od, I.Lq, I.Dv, I.Dv, I.o, c, CUSPARSE_ORDER_ROW));
    if (I.spmm_batched) {
      CS(cusparseCsrSetStridedBatch(I.Pm, int(I.nb), 0, I.nnz));
      CS(cusparseDnMatSetStridedBatch(I.Vd, int(I.nb), I.Lk * I.Dv));
      CS(cusparseDnMatSetStridedBatch(I.Od, int(I.nb), I.Lq * I.Dv));
    }
    const float one = 1.f, zero = 0.f;
    size_t bytes = 0;
    if (cusparseSpMM_bufferSize(I.handle, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, I.Pm,
                                I.Vd, &zero, I.Od, CUDA_R_32F, CUSPARSE_SPMM_ALG_DEFAULT, &bytes) != CUSPARSE_STATUS_SUCCESS)
      return false;
    I.buf_spmm = I.alloc(bytes);
    if (cusparseSpMM_preprocess(I.handle, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, I.Pm,
                                I.Vd, &zero, I.Od, CUDA_R_32F, CUSPARSE_SPMM_ALG_DEFAULT, I.buf_spmm) != CUSPARSE_STATUS_SUCCESS)
      return false;
    // One trial call: some refusals only show here.
    if (cusparseSpMM(I.handle, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, I.Pm, I.Vd, &zero,
                     I.Od, CUDA_R_32F, CUSPARSE_SPMM_ALG_DEFAULT, I.buf_spmm) != CUSPARSE_STATUS_SUCCESS)
      return false;
    I.ab_spmm = ab;
    I.c_spmm = c;
    return true;
  };
  const cudaDataType in = cuda_type(pr.dtype);
  I.spmm_batched = want_batched;
  ok = make_spmm(in, in) || make_spmm(in, CUDA_R_32F) || make_spmm(CUDA_R_32F, CUDA_R_32F);
  if (!ok && want_batched) {
    I.spmm_batched = false;
    ok = make_spmm(in, in) || make_spmm(in, CUDA_R_32F) || make_spmm(CUDA_R_32F, CUDA_R_32F);
  }
  if (!ok) throw Error("cusparse baseline: cusparseSpMM refuses every configuration tried (" +
                       std::string(I.spmm_batched ? "batched" : "per head") + ")");
  CU(cudaDeviceSynchronize());
}

CusparseBaseline::~CusparseBaseline() = default;

void CusparseBaseline::sddmm(CUstream_st* stream) {
  Impl& I = *impl_;
  CS(cusparseSetStream(I.handle, stream));
  const float one = 1.f, zero = 0.f;
  if (I.batched) {
    CS(cusparseSDDMM(I.handle, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_TRANSPOSE, &one, I.A, I.B, &zero, I.Sm,
                     CUDA_R_32F, CUSPARSE_SDDMM_ALG_DEFAULT, I.buf_sddmm));
    return;
  }
  const int es = I.ab_sddmm == CUDA_R_32F ? 4 : 2;
  char* q = static_cast<char*>(I.qh32 && es == 4 ? I.qh32 : I.qh);
  char* k = static_cast<char*>(I.kh32 && es == 4 ? I.kh32 : I.kh);
  for (int64_t i = 0; i < I.nb; ++i) {
    CS(cusparseDnMatSetValues(I.A, q + i * I.Lq * I.D * es));
    CS(cusparseDnMatSetValues(I.B, k + i * I.Lk * I.D * es));
    CS(cusparseCsrSetPointers(I.Sm, I.offsets, I.cols, I.s + i * I.nnz));
    CS(cusparseSDDMM(I.handle, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_TRANSPOSE, &one, I.A, I.B, &zero, I.Sm,
                     CUDA_R_32F, CUSPARSE_SDDMM_ALG_DEFAULT, I.buf_sddmm));
  }
}

void CusparseBaseline::spmm(CUstream_st* stream) {
  Impl& I = *impl_;
  CS(cusparseSetStream(I.handle, stream));
  const float one = 1.f, zero = 0.f;
  if (I.spmm_batched) {
    CS(cusparseSpMM(I.handle, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, I.Pm, I.Vd, &zero,
                    I.Od, CUDA_R_32F, CUSPARSE_SPMM_ALG_DEFAULT, I.buf_spmm));
    return;
  }
  const int pes = I.ab_spmm == CUDA_R_32F ? 4 : 2, ces = I.c_spmm == CUDA_R_32F ? 4 : 2;
  char* v = static_cast<char*>(pes == 4 && I.vh32 ? I.vh32 : I.vh);
  for (int64_t i = 0; i < I.nb; ++i) {
    CS(cusparseCsrSetPointers(I.Pm, I.offsets, I.cols, static_cast<char*>(I.p) + i * I.nnz * pes));
    CS(cusparseDnMatSetValues(I.Vd, v + i * I.Lk * I.Dv * pes));
    CS(cusparseDnMatSetValues(I.Od, static_cast<char*>(I.o) + i * I.Lq * I.Dv * ces));
    CS(cusparseSpMM(I.handle, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, I.Pm, I.Vd, &zero,
                    I.Od, CUDA_R_32F, CUSPARSE_SPMM_ALG_DEFAULT, I.buf_spmm));
  }
}

std::string CusparseBaseline::sddmm_dtype() const { return std::string(type_name(impl_->ab_sddmm)) + "->f32"; }
std::string CusparseBaseline::spmm_dtype() const {
  return std::string(type_name(impl_->ab_spmm)) + "->" + type_name(impl_->c_spmm);
}
std::string CusparseBaseline::mode() const {
  return std::string(impl_->batched ? "sddmm batched" : "sddmm per head") + (impl_->spmm_batched ? ", spmm batched" : ", spmm per head");
}

}  // namespace spattn::bench
