// LinearEngine: the cuBLASLt path (prefill-sized m) and the dispatch between it and the skinny
// kernel.
//
// Layout mapping. cuBLASLt is column-major. Row-major W[n, k] is the column-major k x n matrix
// Wc (ld k), row-major x[m, k] the column-major k x m matrix Xc (ld k), and row-major y[m, n] the
// column-major n x m matrix Yc (ld n). y = x . W^T  <=>  Yc = Wc^T . Xc, so
//   A = Wc (stored k x n, op T), B = Xc (stored k x m, op N), D = Yc (n x m).
// This "TN" form is also the one cuBLASLt's Hopper kernels prefer (both operands K-major).
#include <cublasLt.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_buffer.h"
#include "backends/cuda/fp8_gemm.h"
#include "backends/cuda/linear.h"
#include "backends/cuda/quant_linear.h"
#include "core/check.h"

namespace kestrel::cuda {

#if !KESTREL_CUDA_FP8_GEMM
// Built without an sm_90a target: the W8A8 path has cuBLASLt's GEMM only.
bool Fp8BlockGemmAvailable() {
  return false;
}
bool Fp8BlockGemmTakesScales(const float*, int64_t) {
  return false;
}
void SetFp8BlockGemmCluster(int, int) {}
void Fp8BlockGemm(const uint8_t*, const float*, int64_t, int64_t, int64_t, const uint8_t*,
                  const float*, int64_t, int64_t, float*, int64_t, cudaStream_t) {
  KCHECK_MSG(false, "this build has no sm_90a target for the FP8 GEMM");
}
#endif

namespace {

// KESTREL_FP8_GEMM: "wgmma" takes Kestrel's own kernel where it is available; otherwise
// cuBLASLt's.
LinearEngine::Fp8Gemm DefaultFp8Gemm() {
  const char* env = std::getenv("KESTREL_FP8_GEMM");
  return env != nullptr && std::string(env) == "wgmma" ? LinearEngine::Fp8Gemm::kWgmma
                                                       : LinearEngine::Fp8Gemm::kCublasLt;
}

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
  // (m, n, k, alignment of x, of w, of y, leading dimension of y)
  using Key = std::tuple<int64_t, int64_t, int64_t, uint32_t, uint32_t, uint32_t, int64_t>;

  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;  // bf16 x bf16 -> f32, f32 compute, A transposed
  DeviceBuffer workspace;               // [workspace_bytes] split-K partials, cuBLASLt's own
  DeviceBuffer dequant;                 // bf16 tiles of quantized weights (prefill-sized m)
  std::mutex mu;                        // guards plans
  std::map<Key, Plan> plans;
  // CublasLtCandidate: the heuristic's algorithms per shape (layouts in `plans`).
  std::map<Key, std::vector<cublasLtMatmulAlgo_t>> candidates;
  // W8A8 FP8 (set_fp8_activations): e4m3 x e4m3 -> f32 with 128x128 block scales on W and
  // 1x128 scales on x; an algorithm per shape, or none (then the bf16 tiles are used).
  bool fp8_activations = false;
  LinearEngine::Fp8Gemm fp8_gemm = DefaultFp8Gemm();
  bool batch_invariant = false;  // set_batch_invariant
  cublasLtMatmulDesc_t fp8_desc = nullptr;
  struct Fp8Plan {
    Plan plan;
    bool ok = false;
    bool bf16_out = false;  // D is bf16 rows in the buffer, converted into y after
    int64_t m_rows = 0;     // rows the GEMM runs (m, or m padded with zero rows)
  };
  std::map<Key, Fp8Plan> fp8_plans;
  int fp8_candidate = 0;      // set_fp8_cublaslt_candidate
  std::string fp8_last_algo;  // Fp8CublasLtLastAlgo

  ~Impl() {
    for (auto& [key, plan] : plans) DestroyLayouts(&plan);
    for (auto& [key, p] : fp8_plans) DestroyLayouts(&p.plan);
    if (fp8_desc != nullptr) cublasLtMatmulDescDestroy(fp8_desc);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
    if (handle != nullptr) cublasLtDestroy(handle);
  }

  const Plan& GetPlan(const Key& key) {
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
    const auto [m, n, k, align_x, align_w, align_y, ldy] = key;
    Plan plan;
    KCUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_16BF, k, n, k));
    KCUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_16BF, k, m, k));
    KCUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.d, CUDA_R_32F, n, m, ldy));

    const cublasStatus_t st = Heuristic(desc, align_x, align_w, align_y, &plan);
    if (st != CUBLAS_STATUS_SUCCESS) {
      const std::string msg = "cuBLASLt has no algorithm for m=" + std::to_string(m) +
                              " n=" + std::to_string(n) + " k=" + std::to_string(k) + ": " +
                              cublasLtGetStatusString(st);
      KCHECK_MSG(false, msg.c_str());
    }
    return plans.emplace(key, plan).first->second;
  }

  static void DestroyLayouts(Plan* p) {
    cublasLtMatrixLayoutDestroy(p->a);
    cublasLtMatrixLayoutDestroy(p->b);
    cublasLtMatrixLayoutDestroy(p->d);
    *p = Plan{};
  }

  // The heuristic's first algorithm for the plan's layouts under `d`, with the pointers aligned
  // as given (A is W, B is x, C and D are y) and this engine's workspace; NOT_SUPPORTED when it
  // has none. With `all`, up to all->size() algorithms, best first, are written there and the
  // vector is cut to the number found.
  cublasStatus_t Heuristic(cublasLtMatmulDesc_t d, uint32_t align_x, uint32_t align_w,
                           uint32_t align_y, Plan* plan,
                           std::vector<cublasLtMatmulAlgo_t>* all = nullptr) {
    cublasLtMatmulPreference_t pref = nullptr;
    KCUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t max_workspace = workspace.size_bytes();
    KCUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace, sizeof(max_workspace)));
    KCUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_w, sizeof(align_w)));
    KCUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_x, sizeof(align_x)));
    KCUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_y, sizeof(align_y)));
    KCUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_y, sizeof(align_y)));
    std::vector<cublasLtMatmulHeuristicResult_t> results(all == nullptr ? 1 : all->size());
    int n_results = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
        handle, d, plan->a, plan->b, plan->d, plan->d, pref, static_cast<int>(results.size()),
        results.data(), &n_results);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_SUCCESS && n_results == 0) st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (st == CUBLAS_STATUS_SUCCESS) {
      plan->algo = results[0].algo;
      if (all != nullptr) {
        all->resize(static_cast<size_t>(n_results));
        for (int i = 0; i < n_results; ++i) (*all)[i] = results[i].algo;
      }
    }
    return st;
  }
  // Candidate i of the heuristic list of y = x W^T's shape and alignments (asked once per
  // shape) with the shape's plan, or null when the heuristic offers fewer than i + 1 algorithms.
  const cublasLtMatmulAlgo_t* Candidate(int i, const void* x, int64_t m, int64_t k, const void* w,
                                        int64_t n, const void* y, const Plan** plan_out) {
    KCHECK(i >= 0 && m >= 1);
    const Key key{m, n, k, PointerAlignment(x), PointerAlignment(w), PointerAlignment(y), n};
    std::lock_guard<std::mutex> lock(mu);
    const Plan& plan = GetPlan(key);
    auto it = candidates.find(key);
    if (it == candidates.end()) {
      std::vector<cublasLtMatmulAlgo_t> all(kMaxCublasLtCandidates);
      Plan probe = plan;  // the same layouts; its algo is overwritten, not the plan's
      if (Heuristic(desc, std::get<3>(key), std::get<4>(key), std::get<5>(key), &probe, &all) !=
          CUBLAS_STATUS_SUCCESS) {
        all.clear();
      }
      it = candidates.emplace(key, std::move(all)).first;
    }
    if (i >= static_cast<int>(it->second.size())) return nullptr;
    *plan_out = &plan;
    return &it->second[static_cast<size_t>(i)];
  }

  // The first configuration cuBLASLt has an algorithm for: f32 output straight into y, else
  // bf16 output into the buffer (converted after), with m as is, then m padded to 16 rows.
  const Fp8Plan& GetFp8Plan(const Key& key) {
    auto it = fp8_plans.find(key);
    if (it != fp8_plans.end()) return it->second;
    const auto [m, n, k, align_x, align_w, align_y, ldy] = key;
    if (fp8_desc == nullptr) {
      KCUBLAS_CHECK(cublasLtMatmulDescCreate(&fp8_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t op_a = CUBLAS_OP_T, op_b = CUBLAS_OP_N;
      KCUBLAS_CHECK(cublasLtMatmulDescSetAttribute(fp8_desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                                   sizeof(op_a)));
      KCUBLAS_CHECK(cublasLtMatmulDescSetAttribute(fp8_desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                                   sizeof(op_b)));
      const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
      const int32_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
      KCUBLAS_CHECK(cublasLtMatmulDescSetAttribute(fp8_desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                                   &a_mode, sizeof(a_mode)));
      KCUBLAS_CHECK(cublasLtMatmulDescSetAttribute(fp8_desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                                                   &b_mode, sizeof(b_mode)));
    }
    // The heuristic validates the scale pointers; real ones are set per call (RunFp8).
    const void* placeholder = workspace.get();
    KCUBLAS_CHECK(cublasLtMatmulDescSetAttribute(fp8_desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                 &placeholder, sizeof(placeholder)));
    KCUBLAS_CHECK(cublasLtMatmulDescSetAttribute(fp8_desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                 &placeholder, sizeof(placeholder)));
    Fp8Plan p;
    std::string tried;
    // (bf16 output, padded m); a padded m needs the bf16 buffer (y has only m rows).
    constexpr std::pair<bool, bool> kConfigs[] = {{false, false}, {true, false}, {true, true}};
    for (const auto& [bf16_out, padded] : kConfigs) {
      if (p.ok) break;
      p.bf16_out = bf16_out;
      p.m_rows = padded ? (m + 15) / 16 * 16 : m;
      KCUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.plan.a, CUDA_R_8F_E4M3, k, n, k));
      KCUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.plan.b, CUDA_R_8F_E4M3, k, p.m_rows, k));
      KCUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.plan.d, p.bf16_out ? CUDA_R_16BF : CUDA_R_32F, n,
                                               p.m_rows, p.bf16_out ? n : ldy));
      // The bf16 output goes to the (256-byte aligned) buffer, the f32 one straight into y.
      std::vector<cublasLtMatmulAlgo_t> all(static_cast<size_t>(fp8_candidate + 1));
      cublasStatus_t st =
          Heuristic(fp8_desc, align_x, align_w, p.bf16_out ? 256u : align_y, &p.plan, &all);
      if (st == CUBLAS_STATUS_SUCCESS) {
        if (fp8_candidate < static_cast<int>(all.size())) {
          p.plan.algo = all[static_cast<size_t>(fp8_candidate)];
        } else {
          st = CUBLAS_STATUS_NOT_SUPPORTED;
        }
      }
      p.ok = st == CUBLAS_STATUS_SUCCESS;
      if (!p.ok) {
        tried += std::string(tried.empty() ? "" : ", ") + (p.bf16_out ? "bf16" : "f32") +
                 " out, m " + std::to_string(p.m_rows) + ": " + cublasLtGetStatusString(st);
        DestroyLayouts(&p.plan);
      }
    }
    if (!p.ok && fp8_candidate == 0) {
      std::fprintf(stderr,
                   "kestrel: cuBLASLt has no block-scaled FP8 algorithm for m=%lld n=%lld k=%lld "
                   "(%s); that shape dequantizes to bf16\n",
                   static_cast<long long>(m), static_cast<long long>(n),
                   static_cast<long long>(k), tried.c_str());
    }
    return fp8_plans.emplace(key, p).first->second;
  }
};

LinearEngine::LinearEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LinearEngine::~LinearEngine() = default;

Result<std::unique_ptr<LinearEngine>> LinearEngine::Create(size_t workspace_bytes,
                                                           size_t dequant_bytes) {
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
  if (dequant_bytes > 0) {
    KASSIGN(impl->dequant,
            DeviceBuffer::Allocate(dequant_bytes, "the dequantized weight tiles"));
  }
  return std::unique_ptr<LinearEngine>(new LinearEngine(std::move(impl)));
}

void LinearEngine::RunCublasLt(const __nv_bfloat16* x, int64_t m, int64_t k,
                               const __nv_bfloat16* w, int64_t n, float* y,
                               cudaStream_t stream) {
  RunCublasLtStrided(x, m, k, w, n, y, n, stream);
}

namespace {

// "algo 21 tile 18 stages 8 split-k 1 reduction 0 swizzle 0 custom 0 cluster 0": the
// configuration of an algorithm, for benchmark lines.
std::string DescribeAlgo(const cublasLtMatmulAlgo_t& algo) {
  struct Field {
    cublasLtMatmulAlgoConfigAttributes_t attr;
    const char* name;
  };
  static constexpr Field kFields[] = {
      {CUBLASLT_ALGO_CONFIG_ID, "algo"},
      {CUBLASLT_ALGO_CONFIG_TILE_ID, "tile"},
      {CUBLASLT_ALGO_CONFIG_STAGES_ID, "stages"},
      {CUBLASLT_ALGO_CONFIG_SPLITK_NUM, "split-k"},
      {CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, "reduction"},
      {CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, "swizzle"},
      {CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, "custom"},
      {CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, "cluster"},
  };
  std::string out;
  for (const Field& f : kFields) {
    // Every field is an integer of at most 8 bytes; the call wants its exact size (asked for
    // first), and a little-endian read into a zeroed uint64_t gives its value.
    size_t size = 0;
    uint64_t v = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, f.attr, nullptr, 0, &size) !=
            CUBLAS_STATUS_SUCCESS ||
        size == 0 || size > sizeof(v) ||
        cublasLtMatmulAlgoConfigGetAttribute(&algo, f.attr, &v, size, &size) !=
            CUBLAS_STATUS_SUCCESS) {
      continue;
    }
    out += std::string(out.empty() ? "" : " ") + f.name + " " + std::to_string(v);
  }
  return out;
}

}  // namespace

bool LinearEngine::RunCublasLtCandidate(int i, const __nv_bfloat16* x, int64_t m, int64_t k,
                                        const __nv_bfloat16* w, int64_t n, float* y,
                                        cudaStream_t stream) {
  const Impl::Plan* plan = nullptr;
  const cublasLtMatmulAlgo_t* algo = impl_->Candidate(i, x, m, k, w, n, y, &plan);
  if (algo == nullptr) return false;
  const float alpha = 1.0f, beta = 0.0f;
  KCUBLAS_CHECK(cublasLtMatmul(impl_->handle, impl_->desc, &alpha, w, plan->a, x, plan->b, &beta,
                               y, plan->d, y, plan->d, algo, impl_->workspace.get(),
                               impl_->workspace.size_bytes(), stream));
  return true;
}

std::string LinearEngine::CublasLtCandidateName(int i, const __nv_bfloat16* x, int64_t m,
                                                int64_t k, const __nv_bfloat16* w, int64_t n,
                                                const float* y) {
  const Impl::Plan* plan = nullptr;
  const cublasLtMatmulAlgo_t* algo = impl_->Candidate(i, x, m, k, w, n, y, &plan);
  return algo == nullptr ? std::string() : DescribeAlgo(*algo);
}

void LinearEngine::RunCublasLtStrided(const __nv_bfloat16* x, int64_t m, int64_t k,
                                      const __nv_bfloat16* w, int64_t n, float* y, int64_t ldy,
                                      cudaStream_t stream) {
  KCHECK(m >= 1 && k >= 1 && n >= 1 && ldy >= n);
  KCHECK(x != nullptr && w != nullptr && y != nullptr);
  const Impl::Key key{m,   n, k, PointerAlignment(x), PointerAlignment(w), PointerAlignment(y),
                      ldy};
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
  if (impl_->batch_invariant) {
    // One kernel for every row count: the tensor-core skinny kernel, whose row i does not depend
    // on the other rows of its call, over chunks of at most kSkinnyKernelMaxRows rows.
    for (int64_t m0 = 0; m0 < m; m0 += kSkinnyKernelMaxRows) {
      SkinnyLinearVariant(kBatchInvariantSkinnyVariant, x + m0 * k,
                          std::min(kSkinnyKernelMaxRows, m - m0), k, w, n, y + m0 * n, stream);
    }
  } else if (m <= kSkinnyMaxRows) {
    SkinnyLinear(x, m, k, w, n, y, stream);
  } else {
    RunCublasLt(x, m, k, w, n, y, stream);
  }
}

void LinearEngine::Run(const __nv_bfloat16* x, int64_t m, int64_t k, const Weight& w, int64_t n,
                       float* y, cudaStream_t stream) {
  KCHECK(m >= 1 && w.n_segments >= 1);
  if (w.is_bf16()) {
    Run(x, m, k, w.bf16(), n, y, stream);
    return;
  }
  KCHECK_MSG(!impl_->batch_invariant, "batch-invariant linear layers take bf16 weights only");
  if (w.input_perm != nullptr && m <= kQuantGemvMaxRows) {
    // GPTQ act-order: x in the stored columns' order, in the dequantization buffer (unused by
    // the GEMV path).
    KCHECK_MSG(impl_->dequant.size_bytes() >= static_cast<size_t>(m * k) * 2,
               "no dequantization buffer for an act-order weight");
    auto* gathered = impl_->dequant.as<__nv_bfloat16>();
    GatherColumns(x, m, k, w.input_perm, gathered, stream);
    x = gathered;
  }
  int64_t row0 = 0;
  for (int i = 0; i < w.n_segments; ++i) {
    const WeightSegment& s = w.seg[i];
    const int64_t rows = s.rows < 0 ? n - row0 : s.rows;
    KCHECK(rows >= 1 && row0 + rows <= n);
    KCHECK(w.input_perm == nullptr || s.format == WeightFormat::kAffine4);
    if (s.format == WeightFormat::kBf16) {
      const auto* wb = static_cast<const __nv_bfloat16*>(s.data);
      if (m <= kSkinnyMaxRows) {
        SkinnyLinear(x, m, k, wb, rows, y + row0, stream);  // one row: no stride to keep
      } else {
        RunCublasLtStrided(x, m, k, wb, rows, y + row0, n, stream);
      }
    } else if (m <= kQuantGemvMaxRows) {
      QuantGemv(x, m, k, s, rows, y + row0, n, stream);
    } else if (s.format == WeightFormat::kFp8Block && impl_->fp8_activations && k % 128 == 0 &&
               RunFp8(x, m, k, s, rows, y + row0, n, stream)) {
      // done: W8A8 on the FP8 tensor cores
    } else {
      // Tiles of whole 128-row blocks that fit the dequantization buffer.
      const int64_t fit = static_cast<int64_t>(impl_->dequant.size_bytes()) / (2 * k);
      KCHECK_MSG(fit >= 128, "no dequantization buffer for quantized weights at this m");
      const int64_t tile = fit / 128 * 128;
      auto* scratch = impl_->dequant.as<__nv_bfloat16>();
      for (int64_t t0 = 0; t0 < rows; t0 += tile) {
        const int64_t t_rows = std::min(tile, rows - t0);
        DequantizeRows(s, t0, t_rows, k, scratch, stream, w.input_perm);
        RunCublasLtStrided(x, m, k, scratch, t_rows, y + row0 + t0, n, stream);
      }
    }
    row0 += rows;
  }
  KCHECK(row0 == n);
}

void LinearEngine::set_fp8_activations(bool on) { impl_->fp8_activations = on; }

void LinearEngine::set_fp8_gemm(Fp8Gemm which) {
  impl_->fp8_gemm = which;
}

LinearEngine::Fp8Gemm LinearEngine::fp8_gemm() const {
  if (impl_->fp8_gemm == Fp8Gemm::kWgmma && !Fp8BlockGemmAvailable()) return Fp8Gemm::kCublasLt;
  return impl_->fp8_gemm;
}

void LinearEngine::set_batch_invariant(bool on) { impl_->batch_invariant = on; }

void LinearEngine::set_fp8_cublaslt_candidate(int i) {
  KCHECK(i >= 0 && i < kMaxCublasLtCandidates);
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (auto& [key, p] : impl_->fp8_plans) Impl::DestroyLayouts(&p.plan);
  impl_->fp8_plans.clear();
  impl_->fp8_candidate = i;
}

std::string LinearEngine::Fp8CublasLtLastAlgo() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->fp8_last_algo;
}

bool LinearEngine::RunFp8(const __nv_bfloat16* x, int64_t m, int64_t k, const WeightSegment& w,
                          int64_t n, float* y, int64_t ldy, cudaStream_t stream) {
  // Per chunk of rows, in the dequantization buffer: codes [rows, k], scales [k/128, rows], and
  // (when the algorithm writes bf16) the output [rows, n].
  auto align = [](size_t b) { return (b + 255) / 256 * 256; };
  if (fp8_gemm() == Fp8Gemm::kWgmma && Fp8BlockGemmTakesScales(w.scale, w.scale_ld)) {
    // Codes [rows, k] and scales [k/128, rows rounded up to 4] per chunk of rows; f32 straight
    // into y.
    const size_t per_row = static_cast<size_t>(k) + static_cast<size_t>(k / 128) * 4;
    const size_t slack = 256 + static_cast<size_t>(k / 128) * 16;
    const size_t bytes = impl_->dequant.size_bytes();
    const int64_t fit = bytes > slack ? static_cast<int64_t>((bytes - slack) / per_row) : 0;
    if (fit < 1) return false;
    auto* base = impl_->dequant.as<uint8_t>();
    for (int64_t m0 = 0; m0 < m; m0 += fit) {
      const int64_t mc = std::min(fit, m - m0), ld_xs = (mc + 3) / 4 * 4;
      auto* xs = reinterpret_cast<float*>(base + align(static_cast<size_t>(mc * k)));
      QuantizeActivationsFp8(x + m0 * k, mc, ld_xs, k, base, xs, stream);
      Fp8BlockGemm(base, xs, ld_xs, mc, k, static_cast<const uint8_t*>(w.data), w.scale, w.scale_ld,
                   n, y + m0 * ldy, ldy, stream);
    }
    return true;
  }
  const size_t per_row = static_cast<size_t>(k) + static_cast<size_t>(k / 128) * 4 +
                         static_cast<size_t>(n) * 2;
  const size_t bytes = impl_->dequant.size_bytes();
  const int64_t fit = bytes > 1024 ? static_cast<int64_t>((bytes - 1024) / per_row) / 16 * 16 : 0;
  if (fit < 16) return false;
  auto* base = impl_->dequant.as<uint8_t>();
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (int64_t m0 = 0; m0 < m; m0 += fit) {
    const int64_t mc = std::min(fit, m - m0);
    float* yc = y + m0 * ldy;
    const Impl::Key key{mc, n, k, PointerAlignment(base), PointerAlignment(w.data),
                        PointerAlignment(yc), ldy};
    const Impl::Fp8Plan& p = impl_->GetFp8Plan(key);
    if (!p.ok) {
      KCHECK_MSG(m0 == 0, "a block-scaled FP8 shape lost its algorithm mid-call");
      return false;
    }
    uint8_t* xq = base;
    auto* xs = reinterpret_cast<float*>(base + align(static_cast<size_t>(p.m_rows * k)));
    auto* d16 = reinterpret_cast<__nv_bfloat16*>(
        reinterpret_cast<uint8_t*>(xs) + align(static_cast<size_t>(p.m_rows * (k / 128)) * 4));
    if (p.m_rows > mc) {  // zero rows past mc: their codes and scales
      KCUDA_CHECK(cudaMemsetAsync(xq, 0, static_cast<size_t>(p.m_rows * k), stream));
      KCUDA_CHECK(cudaMemsetAsync(xs, 0, static_cast<size_t>(p.m_rows * (k / 128)) * 4, stream));
    }
    QuantizeActivationsFp8(x + m0 * k, mc, p.m_rows, k, xq, xs, stream);
    const void* a_scale = w.scale;
    const void* b_scale = xs;
    KCUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        impl_->fp8_desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale)));
    KCUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        impl_->fp8_desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale)));
    if (impl_->fp8_candidate != 0) impl_->fp8_last_algo = DescribeAlgo(p.plan.algo);
    const float alpha = 1.0f, beta = 0.0f;
    void* d = p.bf16_out ? static_cast<void*>(d16) : static_cast<void*>(yc);
    KCUBLAS_CHECK(cublasLtMatmul(impl_->handle, impl_->fp8_desc, &alpha, w.data, p.plan.a, xq,
                                 p.plan.b, &beta, d, p.plan.d, d, p.plan.d, &p.plan.algo,
                                 impl_->workspace.get(), impl_->workspace.size_bytes(), stream));
    if (p.bf16_out) Bf16RowsToF32(d16, mc, n, yc, ldy, stream);
  }
  return true;
}

const char* LinearEngine::PathName(int64_t m) {
  return m <= kSkinnyMaxRows ? "skinny" : "cublaslt";
}

}  // namespace kestrel::cuda
