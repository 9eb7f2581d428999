// Fused CPU attention, bf16 and float32 (kernels/cpu/attention.h).
#include "mllm/kernels/cpu/attention.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/BFloat16.h>

#include "mllm/core/error.h"
#include "mllm/kernels/cpu/bf16_linear.h"
#include "mllm/kernels/cpu/dropout.h"
#include "mllm/kernels/cpu/dropout_bits.h"
#include "mllm/kernels/cpu/mkl_gemm.h"
#include "mllm/kernels/cpu/vec16.h"

namespace mllm {
namespace {

using c10::detail::f32_from_bits;
using c10::detail::round_to_nearest_even;
using namespace vec16;  // NOLINT(build/namespaces): the 16-lane helpers of the row passes
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The float32 product in the form of GemmBf16Bf16F32 (row-major only; mkl_gemm.h).
void sgemm_row_major(int /*layout: row-major*/, int transa, int transb, int m, int n, int k,
                     float alpha, const void* a, int lda, const void* b, int ldb, float beta,
                     float* c, int ldc) {
  mkl_sgemm_row_major(transa == cblas::kTrans, transb == cblas::kTrans, m, n, k, alpha,
                      static_cast<const float*>(a), lda, static_cast<const float*>(b), ldb, beta,
                      c, ldc);
}

// The kernel's two element types: the probabilities, the gradients of the scores, q/k/v, the
// output and its gradients are all of one. Bf16: bit patterns (uint16_t), the products from
// bf16_gemm_f32() (oneMKL's cblas_gemm_bf16bf16f32, or sgemm on the widened operands:
// bf16_linear.h), each value rounded once from float32. F32: float, the
// products from oneMKL's sgemm, nothing rounded.
struct Bf16 {
  using T = uint16_t;
  static constexpr torch::ScalarType kDtype = torch::kBFloat16;
  [[gnu::always_inline]] static Floats get(const T* p) { return from_bf16(load<Halves>(p)); }
  [[gnu::always_inline]] static void put(T* p, Floats f) { store(p, to_bf16(f)); }
  [[gnu::always_inline]] static float get1(T x) { return f32_from_bits(x); }
  [[gnu::always_inline]] static T put1(float f) { return round_to_nearest_even(f); }
  // 16 lanes of -1 where p[i] is nonzero (a bit pattern other than +0), else 0.
  [[gnu::always_inline]] static Ints nonzero(const T* p) {
    return __builtin_convertvector(load<Halves>(p), Ints) != 0;
  }
  static GemmBf16Bf16F32 gemm() { return bf16_gemm_f32(); }
};
struct F32 {
  using T = float;
  static constexpr torch::ScalarType kDtype = torch::kFloat;
  [[gnu::always_inline]] static Floats get(const T* p) { return load<Floats>(p); }
  [[gnu::always_inline]] static void put(T* p, Floats f) { store(p, f); }
  [[gnu::always_inline]] static float get1(T x) { return x; }
  [[gnu::always_inline]] static T put1(float f) { return f; }
  [[gnu::always_inline]] static Ints nonzero(const T* p) { return load<Floats>(p) != 0.0f; }
  static GemmBf16Bf16F32 gemm() { return mkl_sgemm_available() ? &sgemm_row_major : nullptr; }
};

// The leading keys a row can attend to: limit[r] = 1 + the last unmasked key of mask row r, 0
// when every key is masked. Every key at or past it is masked: the row passes skip them.
void row_limits(const uint8_t* m, int64_t rows, int64_t keys, int32_t* limit) {
  for (int64_t r = 0; r < rows; ++r) {
    int64_t k = keys;
    while (k > 0 && m[r * keys + k - 1] != 0) --k;
    limit[r] = static_cast<int32_t>(k);
  }
}

// Where a row's passes end: its limit rounded up to whole vectors (at most keys).
inline int64_t row_end(int32_t limit, int64_t keys) {
  return std::min(keys, (limit + kLanes - 1) / kLanes * kLanes);
}

// Each head runs in blocks of kRowBlock query rows (their scores stay in cache between the
// products and the row passes), each block's products over the keys its rows can attend to:
// ends[i] = the largest row_end of block i's rows (keys when one of them has every key masked).
// Causal attention over n blocks computes (n + 1) / 2n of the full products: 3/4 at 256 keys.
constexpr int64_t kRowBlock = 128;
void block_ends(const int32_t* limit, int64_t rows, int64_t keys, int32_t* ends) {
  for (int64_t r0 = 0, i = 0; r0 < rows; r0 += kRowBlock, ++i) {
    int64_t end = 0;
    for (int64_t r = r0; r < std::min(rows, r0 + kRowBlock); ++r)
      end = std::max(end, limit[r] == 0 ? keys : row_end(limit[r], keys));
    ends[i] = static_cast<int32_t>(end);
  }
}

// One head's rows of the forward pass. s [rows, keys] float32 scores (overwritten; only the
// first row_end(limit[r]) keys of row r are read), bias [rows, keys] the mask as 0 / -inf,
// limit [rows] its row_limits -> y [rows, keys] = the softmax over the unmasked keys, in E's
// element type (bf16: rounded once; a row with every key masked: 1 / keys each, as
// masked_fill(-1e9) gives in float32); with yd non-null, yd = keep ? E(float(y) * scale) : 0
// with mllm::dropout's mask for element pair0 * 2 + r * keys + k of the [batch, heads, seq,
// keys] probabilities. keys even.
template <typename E>
[[gnu::always_inline]] inline void softmax_dropout_rows_impl(
    float* __restrict s, const float* __restrict bias, const int32_t* __restrict limit,
    typename E::T* __restrict y, typename E::T* __restrict yd, int64_t rows, int64_t keys,
    int64_t pair0, uint64_t seed, uint32_t threshold, float scale) {
  using T = typename E::T;
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * keys;
    const float* br = bias + r * keys;
    T* yr = y + r * keys;
    const int64_t end = limit[r] == 0 ? keys : row_end(limit[r], keys);
    const int64_t vend = end / kLanes * kLanes;
    if (limit[r] == 0) {
      const T uniform = E::put1(1.0f / static_cast<float>(keys));
      for (int64_t k = 0; k < keys; ++k) yr[k] = uniform;
    } else {
      Floats lanes = splat(kNegInf);
      for (int64_t k = 0; k < vend; k += kLanes) {
        const Floats v = load<Floats>(sr + k) + load<Floats>(br + k);
        store(sr + k, v);
        lanes = v > lanes ? v : lanes;
      }
      for (int64_t k = vend; k < end; ++k) sr[k] += br[k];
      float mx = kNegInf;
      for (int64_t l = 0; l < kLanes; ++l) mx = lanes[l] > mx ? lanes[l] : mx;
      for (int64_t k = vend; k < end; ++k) mx = sr[k] > mx ? sr[k] : mx;
      Floats sums = {};
      for (int64_t k = 0; k < vend; k += kLanes) {
        const Floats v = load<Floats>(sr + k);
        const Floats e = v == kNegInf ? Floats{} : exp_nonpositive(v - mx);
        store(sr + k, e);
        sums += e;
      }
      float sum = 0.0f;
      for (int64_t l = 0; l < kLanes; ++l) sum += sums[l];
      for (int64_t k = vend; k < end; ++k) {
        sr[k] = sr[k] == kNegInf ? 0.0f : exp_nonpositive(sr[k] - mx);
        sum += sr[k];
      }
      const float inv = 1.0f / sum;
      for (int64_t k = 0; k < vend; k += kLanes) E::put(yr + k, load<Floats>(sr + k) * inv);
      for (int64_t k = vend; k < end; ++k) yr[k] = E::put1(sr[k] * inv);
      std::memset(yr + end, 0, (keys - end) * sizeof(T));
    }
    if (yd == nullptr) continue;
    T* ydr = yd + r * keys;
    const int64_t j0 = pair0 + r * keys / 2;
    // (Past `end`, y is 0: so is yd, kept or not.) Eight pairs at a time, then one by one.
    const int64_t pairs = end / 2, vpairs = pairs / 8 * 8;
    for (int64_t j = 0; j < vpairs; j += 8)
      E::put(ydr + 2 * j, keep16(seed, j0 + j, threshold) ? E::get(yr + 2 * j) * scale : Floats{});
    for (int64_t j = vpairs; j < pairs; ++j) {
      const auto [b0, b1] = dropout_bits::pair_bits(seed, j0 + j);
      const T v0 = E::put1(E::get1(yr[2 * j]) * scale);
      const T v1 = E::put1(E::get1(yr[2 * j + 1]) * scale);
      ydr[2 * j] = b0 >= threshold ? v0 : T{0};
      ydr[2 * j + 1] = b1 >= threshold ? v1 : T{0};
    }
    std::memset(ydr + end, 0, (keys - end) * sizeof(T));
  }
}

// One head's rows of the backward pass. g [rows, keys] float32 = d loss / d (dropped)
// probabilities (overwritten; only the first row_end(limit[r]) keys of row r are read), y and yd
// as softmax_dropout_rows wrote them (yd null without dropout), limit the mask's row_limits ->
// ds [rows, keys] = d loss / d scores in E's element type (bf16: rounded once):
//   gy = yd != 0 ? g * scale : 0 with dropout (yd is nonzero exactly where the element was kept,
//        except where y is 0, whose terms below are 0 either way), g without;
//   ds = (gy - sum_k gy_k y_k) * y   (PyTorch's softmax backward in float32, the row sum in 16
//        lanes in a fixed order),
// which is 0 at masked places (y is 0 there), and 0 for a row with every key masked, as
// masked_fill's backward gives.
template <typename E>
[[gnu::always_inline]] inline void softmax_dropout_grad_rows_impl(
    float* __restrict g, const typename E::T* __restrict y, const typename E::T* __restrict yd,
    const int32_t* __restrict limit, typename E::T* __restrict ds, int64_t rows, int64_t keys,
    float scale) {
  using T = typename E::T;
  for (int64_t r = 0; r < rows; ++r) {
    float* gr = g + r * keys;
    const T* yr = y + r * keys;
    T* dsr = ds + r * keys;
    const int64_t end = row_end(limit[r], keys), vend = end / kLanes * kLanes;
    if (yd != nullptr) {
      const T* ydr = yd + r * keys;
      for (int64_t k = 0; k < vend; k += kLanes)
        store(gr + k, E::nonzero(ydr + k) ? load<Floats>(gr + k) * scale : Floats{});
      for (int64_t k = vend; k < end; ++k) gr[k] = ydr[k] != 0 ? gr[k] * scale : 0.0f;
    }
    Floats sums = {};
    for (int64_t k = 0; k < vend; k += kLanes) sums += load<Floats>(gr + k) * E::get(yr + k);
    float dot = 0.0f;
    for (int64_t l = 0; l < kLanes; ++l) dot += sums[l];
    for (int64_t k = vend; k < end; ++k) dot += gr[k] * E::get1(yr[k]);
    for (int64_t k = 0; k < vend; k += kLanes)
      E::put(dsr + k, (load<Floats>(gr + k) - dot) * E::get(yr + k));
    for (int64_t k = vend; k < end; ++k) dsr[k] = E::put1((gr[k] - dot) * E::get1(yr[k]));
    std::memset(dsr + end, 0, (keys - end) * sizeof(T));
  }
}

// dst[r * ld + c] = src[r * cols + c] for rows x cols float32, in E's element type (bf16: round
// to nearest even, c10's round_to_nearest_even bit for bit), 16 columns at a time.
template <typename E>
[[gnu::always_inline]] inline void round_rows_impl(const float* __restrict src, int64_t rows,
                                                   int64_t cols, typename E::T* __restrict dst,
                                                   int64_t ld) {
  const int64_t vcols = cols / kLanes * kLanes;
  for (int64_t r = 0; r < rows; ++r) {
    const float* sr = src + r * cols;
    typename E::T* dr = dst + r * ld;
    for (int64_t c = 0; c < vcols; c += kLanes) E::put(dr + c, load<Floats>(sr + c));
    for (int64_t c = vcols; c < cols; ++c) dr[c] = E::put1(sr[c]);
  }
}

// The row passes above for each element type, compiled three times (x86-64-v4 = AVX-512,
// x86-64-v3 = AVX2 + FMA, baseline; chosen when the library loads): the v3 and v4 versions
// contract multiply-adds alike, so they give the same bits; the baseline version (no FMA) may
// differ in the last bit of a float32 value.
#if defined(__x86_64__) && defined(__GNUC__)
#define MLLM_ROW_PASS __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MLLM_ROW_PASS
#endif
MLLM_ROW_PASS void softmax_dropout_rows(float* s, const float* bias, const int32_t* limit,
                                       uint16_t* y, uint16_t* yd, int64_t rows, int64_t keys,
                                       int64_t pair0, uint64_t seed, uint32_t threshold,
                                       float scale) {
  softmax_dropout_rows_impl<Bf16>(s, bias, limit, y, yd, rows, keys, pair0, seed, threshold,
                                  scale);
}
MLLM_ROW_PASS void softmax_dropout_rows(float* s, const float* bias, const int32_t* limit,
                                       float* y, float* yd, int64_t rows, int64_t keys,
                                       int64_t pair0, uint64_t seed, uint32_t threshold,
                                       float scale) {
  softmax_dropout_rows_impl<F32>(s, bias, limit, y, yd, rows, keys, pair0, seed, threshold,
                                 scale);
}
MLLM_ROW_PASS void softmax_dropout_grad_rows(float* g, const uint16_t* y, const uint16_t* yd,
                                            const int32_t* limit, uint16_t* ds, int64_t rows,
                                            int64_t keys, float scale) {
  softmax_dropout_grad_rows_impl<Bf16>(g, y, yd, limit, ds, rows, keys, scale);
}
MLLM_ROW_PASS void softmax_dropout_grad_rows(float* g, const float* y, const float* yd,
                                            const int32_t* limit, float* ds, int64_t rows,
                                            int64_t keys, float scale) {
  softmax_dropout_grad_rows_impl<F32>(g, y, yd, limit, ds, rows, keys, scale);
}
MLLM_ROW_PASS void round_rows(const float* src, int64_t rows, int64_t cols, uint16_t* dst,
                             int64_t ld) {
  round_rows_impl<Bf16>(src, rows, cols, dst, ld);
}
MLLM_ROW_PASS void round_rows(const float* src, int64_t rows, int64_t cols, float* dst,
                             int64_t ld) {
  round_rows_impl<F32>(src, rows, cols, dst, ld);
}
#undef MLLM_ROW_PASS

// acc[i] += x[i] for n float32 values (one rounding each, so the same bits however compiled).
void add_into(float* __restrict acc, const float* __restrict x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
}

// A [batch, len, heads, head_dim] tensor of element type T as the products read it: head h of
// batch b is the [len, head_dim] matrix at at(b, h) with leading dimension ld.
template <typename T>
struct Heads {
  const T* data;
  int64_t batch_stride, ld, head_dim;
  const T* at(int64_t b, int64_t h) const { return data + b * batch_stride + h * head_dim; }
};
// The tensor itself when its head dimension is dense and its heads side by side in each row (the
// split outputs of mllm::linears), else a contiguous copy; `keep` holds what was read.
template <typename T>
Heads<T> heads_of(const torch::Tensor& x, torch::Tensor& keep) {
  const bool readable = x.stride(3) == 1 && x.stride(2) == x.size(3) &&
                        x.stride(1) >= x.size(2) * x.size(3);
  keep = readable ? x : x.contiguous();
  return {static_cast<const T*>(keep.const_data_ptr()), keep.stride(0),
          keep.stride(1), keep.size(3)};
}

// A size or stride as oneMKL's LP64 int; throws mllm::Error past 2^31 - 1.
int to_int(int64_t v) {
  MLLM_CHECK(v <= std::numeric_limits<int>::max(),
             "cpu_attention: a size or stride of 2^31 or more");
  return static_cast<int>(v);
}

// The mask as the passes read it: bias [batch or 1, seq, keys] float32 (0 where allowed, -inf
// where masked: added to the scores), limit [batch or 1, seq] int32 (row_limits) and ends
// [batch or 1, row blocks] int32 (block_ends).
struct MaskRows {
  torch::Tensor bias, limit, ends;
};
MaskRows mask_rows(const torch::Tensor& mask) {
  const int64_t n = mask.size(0), rows = mask.size(2), keys = mask.size(3);
  MaskRows m;
  m.limit = torch::empty({n, rows}, mask.options().dtype(torch::kInt));
  const auto* bits = reinterpret_cast<const uint8_t*>(mask.const_data_ptr());
  for (int64_t i = 0; i < n; ++i)
    row_limits(bits + i * rows * keys, rows, keys, m.limit.data_ptr<int32_t>() + i * rows);
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  m.ends = torch::empty({n, blocks}, m.limit.options());
  for (int64_t i = 0; i < n; ++i)
    block_ends(m.limit.data_ptr<int32_t>() + i * rows, rows, keys,
               m.ends.data_ptr<int32_t>() + i * blocks);
  m.bias = torch::zeros({n, rows, keys}, mask.options().dtype(torch::kFloat))
               .masked_fill_(mask.view({n, rows, keys}), kNegInf);
  return m;
}

// Everything the passes need besides the tensors' data.
struct Problem {
  int64_t batch, seq, heads, keys, kv_heads, head_dim;
  float alpha;                 // the score scale
  const float* bias;           // MaskRows::bias (null in the backward pass, which reads none)
  const int32_t* limit;        // MaskRows::limit
  const int32_t* ends;         // MaskRows::ends
  int64_t bias_batch_stride;   // seq * keys, 0 for a mask shared by the batch
  int64_t limit_batch_stride;  // seq, or 0
  int64_t ends_batch_stride;   // row blocks, or 0
  const float* bias_of(int64_t b) const { return bias + b * bias_batch_stride; }
  const int32_t* limit_of(int64_t b) const { return limit + b * limit_batch_stride; }
  const int32_t* ends_of(int64_t b) const { return ends + b * ends_batch_stride; }
};

Problem problem_of(const torch::Tensor& q, const torch::Tensor& k, const MaskRows& m,
                   double scale) {
  const bool shared = m.limit.size(0) == 1;
  return {q.size(0),
          q.size(1),
          q.size(2),
          k.size(1),
          k.size(2),
          q.size(3),
          static_cast<float>(scale),
          m.bias.defined() ? m.bias.const_data_ptr<float>() : nullptr,
          m.limit.const_data_ptr<int32_t>(),
          m.ends.const_data_ptr<int32_t>(),
          shared ? 0 : q.size(1) * k.size(1),
          shared ? 0 : q.size(1),
          shared ? 0 : m.ends.size(1)};
}

// The forward pass: out [batch, seq, heads * head_dim] of E's dtype. y and yd, when defined,
// receive the probabilities and their dropped form ([batch, heads, seq, keys], E's dtype);
// otherwise they live in per-thread scratch. `drop` null: no dropout.
template <typename E>
torch::Tensor attention_forward(const Problem& pb, const Heads<typename E::T>& q,
                                const Heads<typename E::T>& k, const Heads<typename E::T>& v,
                                const DropoutDraw* drop, const torch::Tensor& y,
                                const torch::Tensor& yd, const torch::TensorOptions& options) {
  using T = typename E::T;
  const GemmBf16Bf16F32 gemm = E::gemm();
  const int64_t t = pb.seq, keys = pb.keys, hd = pb.head_dim, group = pb.heads / pb.kv_heads;
  torch::Tensor out = torch::empty({pb.batch, t, pb.heads * hd}, options.dtype(E::kDtype));
  auto* out_p = static_cast<T*>(out.data_ptr());
  auto* y_p = y.defined() ? static_cast<T*>(y.data_ptr()) : nullptr;
  auto* yd_p = yd.defined() ? static_cast<T*>(yd.data_ptr()) : nullptr;
  const int mk = to_int(keys), mh = to_int(hd), ldq = to_int(q.ld), ldk = to_int(k.ld),
            ldv = to_int(v.ld);
  at::parallel_for(0, pb.batch * pb.heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(static_cast<size_t>(kRowBlock * keys)), o(static_cast<size_t>(t * hd));
    std::vector<T> y_scratch(y_p == nullptr ? kRowBlock * keys : 0);
    std::vector<T> yd_scratch(drop != nullptr && yd_p == nullptr ? kRowBlock * keys : 0);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / pb.heads, h = task % pb.heads, kh = h / group;
      const int32_t* ends = pb.ends_of(b);
      // Block by block: the scores of kRowBlock queries over the keys they see (in cache), their
      // probabilities, and those times v.
      for (int64_t r0 = 0, i = 0; r0 < t; r0 += kRowBlock, ++i) {
        const int64_t rows = std::min(kRowBlock, t - r0);
        T* yb = y_p != nullptr ? y_p + (task * t + r0) * keys : y_scratch.data();
        T* ydb = drop == nullptr          ? nullptr
                        : yd_p != nullptr ? yd_p + (task * t + r0) * keys
                                          : yd_scratch.data();
        gemm(cblas::kRowMajor, cblas::kNoTrans, cblas::kTrans, static_cast<int>(rows), ends[i], mh,
             pb.alpha, q.at(b, h) + r0 * q.ld, ldq, k.at(b, kh), ldk, 0.0f, s.data(), mk);
        softmax_dropout_rows(s.data(), pb.bias_of(b) + r0 * keys, pb.limit_of(b) + r0, yb, ydb,
                             rows, keys, (task * t + r0) * keys / 2,
                             drop != nullptr ? drop->seed : 0,
                             drop != nullptr ? drop->threshold : 0,
                             drop != nullptr ? drop->scale : 1.0f);
        gemm(cblas::kRowMajor, cblas::kNoTrans, cblas::kNoTrans, static_cast<int>(rows), mh,
             ends[i], 1.0f, ydb != nullptr ? ydb : yb, mk, v.at(b, kh), ldv, 0.0f,
             o.data() + r0 * hd, mh);
      }
      round_rows(o.data(), t, hd, out_p + b * t * pb.heads * hd + h * hd, pb.heads * hd);
    }
  });
  return out;
}

template <typename E>
struct CpuAttentionFunction : public torch::autograd::Function<CpuAttentionFunction<E>> {
  using T = typename E::T;
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& mask, double scale, double p) {
    torch::Tensor qk, kk, vk;
    const Heads<T> qh = heads_of<T>(q, qk), kh = heads_of<T>(k, kk), vh = heads_of<T>(v, vk);
    const MaskRows rows = mask_rows(mask);
    const Problem pb = problem_of(q, k, rows, scale);
    std::optional<DropoutDraw> drop;
    if (p > 0.0) drop = draw_dropout(p);
    const auto elems = q.options().dtype(E::kDtype);
    torch::Tensor y = torch::empty({pb.batch, pb.heads, pb.seq, pb.keys}, elems);
    torch::Tensor yd = drop ? torch::empty_like(y) : torch::Tensor();
    torch::Tensor out;
    {
      RECORD_FUNCTION("mllm::cpu_attention", std::vector<c10::IValue>({q, k, v}));
      out = attention_forward<E>(pb, qh, kh, vh, drop ? &*drop : nullptr, y, yd, elems);
    }
    ctx->save_for_backward({qk, kk, vk, rows.limit, rows.ends, y, drop ? yd : y});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["drop_scale"] = drop ? static_cast<double>(drop->scale) : 0.0;
    return out;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    RECORD_FUNCTION("mllm::cpu_attention_backward", std::vector<c10::IValue>());
    const auto saved = ctx->get_saved_variables();
    torch::Tensor qk, kk, vk;
    const Heads<T> q = heads_of<T>(saved[0], qk), k = heads_of<T>(saved[1], kk),
                   v = heads_of<T>(saved[2], vk);
    const MaskRows rows{torch::Tensor(), saved[3], saved[4]};
    const torch::Tensor& y = saved[5];
    const double drop_scale = ctx->saved_data["drop_scale"].toDouble();
    const bool dropout = drop_scale != 0.0;
    const torch::Tensor& yd = saved[6];
    const Problem pb = problem_of(qk, kk, rows, ctx->saved_data["scale"].toDouble());
    const torch::Tensor d_out = grads[0].to(E::kDtype).contiguous();
    const int64_t t = pb.seq, keys = pb.keys, hd = pb.head_dim, group = pb.heads / pb.kv_heads;
    // dq, dk and dv side by side in one [batch, seq, heads + 2 kv_heads, head_dim] buffer (where
    // keys == seq), in the order of q/k/v as mllm::linears splits them: the Q/K/V product's
    // backward then reads them as one matrix without concatenating them (bf16_linear.cpp,
    // f32_linear.cpp).
    torch::Tensor dq, dk, dv;
    if (keys == t) {
      const torch::Tensor dqkv =
          torch::empty({pb.batch, t, pb.heads + 2 * pb.kv_heads, hd}, y.options());
      dq = dqkv.narrow(2, 0, pb.heads);
      dk = dqkv.narrow(2, pb.heads, pb.kv_heads);
      dv = dqkv.narrow(2, pb.heads + pb.kv_heads, pb.kv_heads);
    } else {
      dq = torch::empty(qk.sizes(), y.options());
      dk = torch::empty(kk.sizes(), y.options());
      dv = torch::empty(vk.sizes(), y.options());
    }
    const GemmBf16Bf16F32 gemm = E::gemm();
    // Row and batch strides (elements) of d_out and of the gradients.
    const int64_t ld_out = pb.heads * hd, ld_dq = dq.stride(1), ld_dkv = dk.stride(1);
    const int64_t dq_batch = dq.stride(0), dkv_batch = dk.stride(0);
    const int mk = to_int(keys), mh = to_int(hd), mo = to_int(ld_out), ldq = to_int(q.ld),
              ldk = to_int(k.ld), ldv = to_int(v.ld);
    const auto* go = static_cast<const T*>(d_out.const_data_ptr());
    const auto* y_p = static_cast<const T*>(y.const_data_ptr());
    const auto* yd_p = static_cast<const T*>(yd.const_data_ptr());
    auto* dq_p = static_cast<T*>(dq.data_ptr());
    auto* dk_p = static_cast<T*>(dk.data_ptr());
    auto* dv_p = static_cast<T*>(dv.data_ptr());
    const auto scale_drop = static_cast<float>(drop_scale);
    // One task per (batch, query head), its row blocks in turn: each block's contributions to
    // the head's dk and dv summed in float32 by the products (beta = 1). With grouped key/value
    // heads each head's sums go to its slot of `partial` ([batch, heads, 2, keys, head_dim]
    // float32), and a second pass adds a group's slots in head order and rounds them once: the
    // same bits at any thread count, and batch x heads tasks to share among the threads (one
    // task per key/value head would leave most threads idle at a small batch with few of them).
    const bool grouped = group > 1;
    const int64_t kv_elems = keys * hd;
    torch::Tensor partial;
    if (grouped)
      partial = torch::empty({pb.batch, pb.heads, 2, keys, hd}, y.options().dtype(torch::kFloat));
    float* partial_p = grouped ? partial.data_ptr<float>() : nullptr;
    at::parallel_for(0, pb.batch * pb.heads, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> g(static_cast<size_t>(kRowBlock * keys));
      std::vector<float> dqf(static_cast<size_t>(t * hd));
      std::vector<float> own(grouped ? 0 : static_cast<size_t>(2 * kv_elems));
      std::vector<T> ds(static_cast<size_t>(kRowBlock * keys));
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / pb.heads, h = task % pb.heads, kh = h / group;
        const int32_t* ends = pb.ends_of(b);
        float* dkf = grouped ? partial_p + task * 2 * kv_elems : own.data();
        float* dvf = dkf + kv_elems;
        std::fill(dkf, dkf + 2 * kv_elems, 0.0f);
        for (int64_t r0 = 0, i = 0; r0 < t; r0 += kRowBlock, ++i) {
          const int64_t rows = std::min(kRowBlock, t - r0);
          const int64_t head_row = task * t + r0;
          const int mr = static_cast<int>(rows), me = ends[i];
          const T* go_b = go + (b * t + r0) * ld_out + h * hd;
          const T* y_b = y_p + head_row * keys;
          const T* yd_b = yd_p + head_row * keys;
          // d loss / d dropped probabilities = d_out v^T, then d loss / d scores
          gemm(cblas::kRowMajor, cblas::kNoTrans, cblas::kTrans, mr, me, mh, 1.0f, go_b, mo,
               v.at(b, kh), ldv, 0.0f, g.data(), mk);
          softmax_dropout_grad_rows(g.data(), y_b, dropout ? yd_b : nullptr, pb.limit_of(b) + r0,
                                    ds.data(), rows, keys, scale_drop);
          // dq = scale * ds k, dk += scale * ds^T q, dv += dropped^T d_out
          gemm(cblas::kRowMajor, cblas::kNoTrans, cblas::kNoTrans, mr, mh, me, pb.alpha,
               ds.data(), mk, k.at(b, kh), ldk, 0.0f, dqf.data() + r0 * hd, mh);
          gemm(cblas::kRowMajor, cblas::kTrans, cblas::kNoTrans, me, mh, mr, pb.alpha, ds.data(),
               mk, q.at(b, h) + r0 * q.ld, ldq, 1.0f, dkf, mh);
          gemm(cblas::kRowMajor, cblas::kTrans, cblas::kNoTrans, me, mh, mr, 1.0f, yd_b, mk, go_b,
               mo, 1.0f, dvf, mh);
        }
        round_rows(dqf.data(), t, hd, dq_p + b * dq_batch + h * hd, ld_dq);
        if (!grouped) {
          round_rows(dkf, keys, hd, dk_p + b * dkv_batch + kh * hd, ld_dkv);
          round_rows(dvf, keys, hd, dv_p + b * dkv_batch + kh * hd, ld_dkv);
        }
      }
    });
    if (grouped) {
      // dk and dv of (batch, key/value head, key row): the group's slots added in head order and
      // rounded, split over all the rows (elementwise: the same bits however split).
      at::parallel_for(0, pb.batch * pb.kv_heads * keys, 64, [&](int64_t begin, int64_t end) {
        for (int64_t row = begin; row < end;) {
          const int64_t bkh = row / keys, r0 = row % keys, r1 = std::min(keys, r0 + (end - row));
          const int64_t b = bkh / pb.kv_heads, kh = bkh % pb.kv_heads, n = (r1 - r0) * hd;
          float* first = partial_p + (b * pb.heads + kh * group) * 2 * kv_elems + r0 * hd;
          for (int64_t j = 1; j < group; ++j) {
            add_into(first, first + j * 2 * kv_elems, n);
            add_into(first + kv_elems, first + j * 2 * kv_elems + kv_elems, n);
          }
          round_rows(first, r1 - r0, hd, dk_p + b * dkv_batch + r0 * ld_dkv + kh * hd, ld_dkv);
          round_rows(first + kv_elems, r1 - r0, hd, dv_p + b * dkv_batch + r0 * ld_dkv + kh * hd,
                     ld_dkv);
          row += r1 - r0;
        }
      });
    }
    return {dq, dk, dv, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool cpu_attention_available(torch::ScalarType dtype) {
  if (dtype == torch::kBFloat16) return Bf16::gemm() != nullptr;
  if (dtype == torch::kFloat) return F32::gemm() != nullptr;
  return false;
}

bool cpu_attention_applies(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                           const torch::Tensor& blocked) {
  const auto dtype = q.defined() ? q.scalar_type() : torch::kBFloat16;
  const auto same_cpu = [&](const torch::Tensor& x) {
    return x.defined() && x.dim() == 4 && x.is_cpu() && x.scalar_type() == dtype;
  };
  if ((dtype != torch::kBFloat16 && dtype != torch::kFloat) || !same_cpu(q) || !same_cpu(k) ||
      !same_cpu(v) || !blocked.defined() || !blocked.is_cpu() ||
      blocked.scalar_type() != torch::kBool || blocked.dim() != 4)
    return false;
  const int64_t b = q.size(0), t = q.size(1), h = q.size(2), hd = q.size(3), keys = k.size(1),
                kvh = k.size(2);
  return k.size(0) == b && k.size(3) == hd && v.sizes() == k.sizes() && kvh > 0 && h % kvh == 0 &&
         hd % 2 == 0 && keys > 0 && keys % 2 == 0 &&
         (blocked.size(0) == 1 || blocked.size(0) == b) &&
         blocked.size(1) == 1 && blocked.size(2) == t && blocked.size(3) == keys;
}

namespace {
template <typename E>
torch::Tensor cpu_attention_of(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& mask, double scale,
                               double drop) {
  using T = typename E::T;
  if (torch::GradMode::is_enabled() &&
      (q.requires_grad() || k.requires_grad() || v.requires_grad()))
    return CpuAttentionFunction<E>::apply(q, k, v, mask, scale, drop);
  torch::Tensor qk, kk, vk;
  const Heads<T> qh = heads_of<T>(q, qk), kh = heads_of<T>(k, kk), vh = heads_of<T>(v, vk);
  std::optional<DropoutDraw> d;
  if (drop > 0.0) d = draw_dropout(drop);
  RECORD_FUNCTION("mllm::cpu_attention", std::vector<c10::IValue>({q, k, v}));
  const MaskRows rows = mask_rows(mask);
  return attention_forward<E>(problem_of(q, k, rows, scale), qh, kh, vh, d ? &*d : nullptr,
                              torch::Tensor(), torch::Tensor(), q.options());
}
}  // namespace

torch::Tensor cpu_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const torch::Tensor& blocked, double scale, double p, bool training) {
  if (!(p >= 0.0 && p < 1.0)) throw Error("cpu_attention: p must be in [0, 1)");
  MLLM_CHECK(cpu_attention_applies(q, k, v, blocked),
             "cpu_attention: expected bf16 or float32 CPU q [b, t, h, hd], k and v [b, keys, kvh, "
             "hd] of q's dtype and a bool mask [b or 1, 1, t, keys] with hd and keys even");
  MLLM_CHECK(cpu_attention_available(q.scalar_type()),
             q.scalar_type() == torch::kBFloat16
                 ? "cpu_attention: mllm's bf16 products are not in use (bf16_linear.h)"
                 : "cpu_attention: LibTorch's libtorch_cpu.so exports no sgemm_");
  const torch::Tensor mask = blocked.contiguous();
  const double drop = training ? p : 0.0;
  return q.scalar_type() == torch::kBFloat16
             ? cpu_attention_of<Bf16>(q, k, v, mask, scale, drop)
             : cpu_attention_of<F32>(q, k, v, mask, scale, drop);
}

}  // namespace mllm
