// oneMKL's float32 GEMM entry points as LibTorch's libtorch_cpu.so exports them (the x86-64
// wheels link oneMKL statically and export its BLAS symbols), for the CPU kernels that call a
// GEMM per block (cpu_attention.cpp) or reuse a packed operand across calls (loss.cpp). Looked
// up once through libtorch_cpu.so's handle (dlsym: the library, then the libraries it loads;
// not a preloaded one). A LibTorch built on another BLAS may export a Fortran sgemm_ of the
// same interface from a library it loads (OpenBLAS, LP64), which then serves; the packed GEMM
// is oneMKL's alone. Where a symbol is missing the callers take ATen's products.
#pragma once

#include <cstddef>

namespace mllm {

// Row-major C [m, n] = alpha op(A) op(B) + beta C (the oneMKL reference, "?gemm"), through
// the Fortran sgemm_ (column-major; C^T = op(B)^T op(A)^T there): A stored [m, k], or [k, m]
// with trans_a; B stored [k, n], or [n, k] with trans_b; leading dimensions in elements.
// Requires mkl_sgemm_available().
void mkl_sgemm_row_major(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                         const float* a, int lda, const float* b, int ldb, float beta, float* c,
                         int ldc);
// Whether sgemm_ was found (above).
bool mkl_sgemm_available();

// oneMKL's packed GEMM ("cblas_?gemm_pack_get_size", "cblas_?gemm_pack", "cblas_?gemm_compute"),
// row-major, for a B operand reused by several products: B [k, n] = op(b) packed once into
// oneMKL's internal layout, then C [m, n] = A [m, k] B + beta C per call without repacking it.
// A plan is tied to m, n, k and op: every compute call uses the m it was packed for.
class MklPackedB {
 public:
  // Whether libtorch_cpu.so exports the three functions.
  static bool available();
  // Packs op(b) (b stored [n, k] with trans_b, [k, n] without; leading dimension ldb) for
  // products with m rows, into a buffer of oneMKL's size for it (about n k floats) freed by the
  // destructor. Throws mllm::Error unless available(), std::bad_alloc without the memory.
  MklPackedB(bool trans_b, int m, int n, int k, const float* b, int ldb);
  ~MklPackedB();
  MklPackedB(const MklPackedB&) = delete;
  MklPackedB& operator=(const MklPackedB&) = delete;
  // c [m, n] (leading dimension ldc) = a [m, k] (leading dimension lda) @ B + beta c.
  void compute(const float* a, int lda, float beta, float* c, int ldc) const;

 private:
  int m_, n_, k_;
  float* packed_;
};

}  // namespace mllm
