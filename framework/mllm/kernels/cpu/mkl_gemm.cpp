// oneMKL's float32 GEMM entry points from libtorch_cpu.so (mkl_gemm.h).
#include "mllm/kernels/cpu/mkl_gemm.h"

#include <dlfcn.h>

#include <cstdlib>
#include <new>

#include "mllm/core/error.h"

namespace mllm {
namespace {

// CBLAS constants (C enums in oneMKL's mkl_cblas.h).
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112, kPacked = 151, kBMatrix = 162;

using SgemmFortran = void (*)(const char* transa, const char* transb, const int* m, const int* n,
                              const int* k, const float* alpha, const float* a, const int* lda,
                              const float* b, const int* ldb, const float* beta, float* c,
                              const int* ldc);
using PackGetSize = size_t (*)(int identifier, int m, int n, int k);
using Pack = void (*)(int layout, int identifier, int trans, int m, int n, int k, float alpha,
                      const float* src, int ld, float* dest);
using Compute = void (*)(int layout, int transa, int transb, int m, int n, int k, const float* a,
                         int lda, const float* b, int ldb, float beta, float* c, int ldc);

struct Symbols {
  SgemmFortran sgemm = nullptr;
  PackGetSize pack_get_size = nullptr;
  Pack pack = nullptr;
  Compute compute = nullptr;
};

const Symbols& symbols() {
  static const Symbols s = [] {
    Symbols r;
    void* torch_cpu = ::dlopen("libtorch_cpu.so", RTLD_NOLOAD | RTLD_LAZY);
    if (torch_cpu == nullptr) return r;
    r.sgemm = reinterpret_cast<SgemmFortran>(::dlsym(torch_cpu, "sgemm_"));
    r.pack_get_size =
        reinterpret_cast<PackGetSize>(::dlsym(torch_cpu, "cblas_sgemm_pack_get_size"));
    r.pack = reinterpret_cast<Pack>(::dlsym(torch_cpu, "cblas_sgemm_pack"));
    r.compute = reinterpret_cast<Compute>(::dlsym(torch_cpu, "cblas_sgemm_compute"));
    return r;
  }();
  return s;
}

}  // namespace

bool mkl_sgemm_available() { return symbols().sgemm != nullptr; }

void mkl_sgemm_row_major(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                         const float* a, int lda, const float* b, int ldb, float beta, float* c,
                         int ldc) {
  const char ta = trans_a ? 'T' : 'N', tb = trans_b ? 'T' : 'N';
  symbols().sgemm(&tb, &ta, &n, &m, &k, &alpha, b, &ldb, a, &lda, &beta, c, &ldc);
}

bool MklPackedB::available() {
  const Symbols& s = symbols();
  return s.pack_get_size != nullptr && s.pack != nullptr && s.compute != nullptr;
}

MklPackedB::MklPackedB(bool trans_b, int m, int n, int k, const float* b, int ldb)
    : m_(m), n_(n), k_(k), packed_(nullptr) {
  MLLM_CHECK(available(), "MklPackedB: libtorch_cpu.so exports no oneMKL packed GEMM");
  const Symbols& s = symbols();
  const size_t bytes = s.pack_get_size(kBMatrix, m, n, k);
  packed_ = static_cast<float*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
  if (packed_ == nullptr) throw std::bad_alloc();
  s.pack(kRowMajor, kBMatrix, trans_b ? kTrans : kNoTrans, m, n, k, 1.0f, b, ldb, packed_);
}

MklPackedB::~MklPackedB() { std::free(packed_); }

void MklPackedB::compute(const float* a, int lda, float beta, float* c, int ldc) const {
  symbols().compute(kRowMajor, kNoTrans, kPacked, m_, n_, k_, a, lda, packed_, n_, beta, c, ldc);
}

}  // namespace mllm
