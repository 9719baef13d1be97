// LinearEngine: the cuBLASLt path (prefill-sized m) and the dispatch between it and the skinny
// kernel.
//
// Layout mapping. cuBLASLt is column-major. Row-major W[n, k] is the column-major k x n matrix
// Wc (ld k), row-major x[m, k] the column-major k x m matrix Xc (ld k), and row-major y[m, n] the
// column-major n x m matrix Yc (ld n). y = x . W^T  <=>  Yc = Wc^T . Xc, so
//   A = Wc (stored k x n, op T), B = Xc (stored k x m, op N), D = Yc (n x m).
// This "TN" form is also the one cuBLASLt's Hopper kernels prefer (both operands K-major).
#include <cublasLt.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_buffer.h"
#include "backends/cuda/linear.h"
#include "core/check.h"

namespace kestrel::cuda {
namespace {

[[noreturn]] void CublasCheckFailed(const char* file, int line, const char* expr,
                                    cublasStatus_t status) {
  std::fprintf(stderr, "cuBLASLt call failed at %s:%d: %s: %s (%s)\n", file, line, expr,
               cublasLtGetStatusName(status), cublasLtGetStatusString(status));
  std::fflush(stderr);
  std::abort();
}

// A failing cuBLASLt call after the handle exists is a bug (bad layout, unsupported type mix).
#define KCUBLAS_CHECK(expr)                                                   \
  do {                                                                        \
    const cublasStatus_t kestrel_cublas_status_ = (expr);                     \
    if (kestrel_cublas_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]         \
      CublasCheckFailed(__FILE__, __LINE__, #expr, kestrel_cublas_status_);   \
  } while (0)

// The alignment cuBLASLt may assume for a pointer: its lowest set address bit, capped at the
// 256 bytes the heuristic assumes by default. Kernels needing more than a buffer has would
// fault or fail, so the alignments are part of the algorithm cache key.
uint32_t PointerAlignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t low_bit = a & (~a + 1);
  return (low_bit == 0 || low_bit > 256) ? 256u : static_cast<uint32_t>(low_bit);
}

}  // namespace

struct LinearEngine::Impl {
  // One shape's matrix layouts and chosen algorithm, made on the first call of that shape.
  struct Plan {
    cublasLtMatrixLayout_t a = nullptr;  // W as column-major k x n
    cublasLtMatrixLayout_t b = nullptr;  // x as column-major k x m
    cublasLtMatrixLayout_t d = nullptr;  // y as column-major n x m (also C; beta = 0)
    cublasLtMatmulAlgo_t algo{};
  };
  // (m, n, k, alignment of x, of w, of y)
  using Key = std::tuple<int64_t, int64_t, int64_t, uint32_t, uint32_t, uint32_t>;

  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;  // bf16 x bf16 -> f32, f32 compute, A transposed
  DeviceBuffer workspace;               // [workspace_bytes] split-K partials, cuBLASLt's own
  std::mutex mu;                        // guards plans
  std::map<Key, Plan> plans;

  ~Impl() {
    for (auto& [key, plan] : plans) {
      cublasLtMatrixLayoutDestroy(plan.a);
      cublasLtMatrixLayoutDestroy(plan.b);
      cublasLtMatrixLayoutDestroy(plan.d);
    }
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
    if (handle != nullptr) cublasLtDestroy(handle);
  }

  const Plan& GetPlan(const Key& key) {
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
    const auto [m, n, k, align_x, align_w, align_y] = key;
    Plan plan;
    KCUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_16BF, k, n, k));
    KCUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_16BF, k, m, k));
    KCUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.d, CUDA_R_32F, n, m, n));

    cublasLtMatmulPreference_t pref = nullptr;
    KCUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t max_workspace = workspace.size_bytes();
    KCUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace, sizeof(max_workspace)));
    // A is W, B is x, C and D are y.
    KCUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_w, sizeof(align_w)));
    KCUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_x, sizeof(align_x)));
    KCUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_y, sizeof(align_y)));
    KCUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_y, sizeof(align_y)));

    cublasLtMatmulHeuristicResult_t result{};
    int n_results = 0;
    KCUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, desc, plan.a, plan.b, plan.d, plan.d,
                                                 pref, 1, &result, &n_results));
    cublasLtMatmulPreferenceDestroy(pref);
    if (n_results == 0) {
      const std::string msg = "cuBLASLt has no algorithm for m=" + std::to_string(m) +
                              " n=" + std::to_string(n) + " k=" + std::to_string(k);
      KCHECK_MSG(n_results > 0, msg.c_str());
    }
    plan.algo = result.algo;
    return plans.emplace(key, plan).first->second;
  }
};

LinearEngine::LinearEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LinearEngine::~LinearEngine() = default;

Result<std::unique_ptr<LinearEngine>> LinearEngine::Create(size_t workspace_bytes) {
  auto impl = std::make_unique<Impl>();
  if (const cublasStatus_t s = cublasLtCreate(&impl->handle); s != CUBLAS_STATUS_SUCCESS) {
    impl->handle = nullptr;
    return Unavailable(std::string("cannot create the cuBLASLt handle: ") +
                       cublasLtGetStatusString(s));
  }
  if (const cublasStatus_t s =
          cublasLtMatmulDescCreate(&impl->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
      s != CUBLAS_STATUS_SUCCESS) {
    impl->desc = nullptr;
    return Internal(std::string("cannot create the cuBLASLt matmul descriptor: ") +
                    cublasLtGetStatusString(s));
  }
  const cublasOperation_t op_a = CUBLAS_OP_T, op_b = CUBLAS_OP_N;
  KCUBLAS_CHECK(cublasLtMatmulDescSetAttribute(impl->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                               sizeof(op_a)));
  KCUBLAS_CHECK(cublasLtMatmulDescSetAttribute(impl->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                               sizeof(op_b)));
  if (workspace_bytes > 0) {
    KASSIGN(impl->workspace, DeviceBuffer::Allocate(workspace_bytes, "cuBLASLt workspace"));
  }
  return std::unique_ptr<LinearEngine>(new LinearEngine(std::move(impl)));
}

void LinearEngine::RunCublasLt(const __nv_bfloat16* x, int64_t m, int64_t k,
                               const __nv_bfloat16* w, int64_t n, float* y,
                               cudaStream_t stream) {
  KCHECK(m >= 1 && k >= 1 && n >= 1);
  KCHECK(x != nullptr && w != nullptr && y != nullptr);
  const Impl::Key key{m, n, k, PointerAlignment(x), PointerAlignment(w), PointerAlignment(y)};
  std::lock_guard<std::mutex> lock(impl_->mu);
  const Impl::Plan& plan = impl_->GetPlan(key);
  const float alpha = 1.0f, beta = 0.0f;
  KCUBLAS_CHECK(cublasLtMatmul(impl_->handle, impl_->desc, &alpha, w, plan.a, x, plan.b, &beta, y,
                               plan.d, y, plan.d, &plan.algo, impl_->workspace.get(),
                               impl_->workspace.size_bytes(), stream));
}

void LinearEngine::Run(const __nv_bfloat16* x, int64_t m, int64_t k, const __nv_bfloat16* w,
                       int64_t n, float* y, cudaStream_t stream) {
  KCHECK(m >= 1);
  if (m <= kSkinnyMaxRows) {
    SkinnyLinear(x, m, k, w, n, y, stream);
  } else {
    RunCublasLt(x, m, k, w, n, y, stream);
  }
}

const char* LinearEngine::PathName(int64_t m) {
  return m <= kSkinnyMaxRows ? "skinny" : "cublaslt";
}

}  // namespace kestrel::cuda
