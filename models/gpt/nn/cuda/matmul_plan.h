// The host-side planning of the cuBLASLt matrix products (matmul.h): element types, the row-major ->
// column-major mapping (Note [Row-major products on a column-major library]), the key that identifies a
// cached cuBLASLt plan, the small LRU cache that holds the plans, and the chunking of the bias-gradient
// reduction. Pure host C++17 (no CUDA headers), so tests/models/gpt/nn/cuda/matmul_plan_test.cc checks all of
// it, the mapping included, in the host-only CI build.
#pragma once

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

namespace strata::kernels::cuda {

// Element type of one operand in device memory. Products always accumulate in fp32.
enum class MatmulDtype : uint8_t { kF32 = 0, kBf16 = 1 };

inline size_t MatmulDtypeBytes(MatmulDtype t) { return t == MatmulDtype::kF32 ? 4 : 2; }
inline const char* MatmulDtypeName(MatmulDtype t) { return t == MatmulDtype::kF32 ? "f32" : "bf16"; }

// The element types of one product call.
//   in:   both factors (a and w / b in the forward, dout and the other factor in the backward);
//   out:  the product's destination (out, da, dw, db), also read when it accumulates;
//   bias: the forward's bias, or the backward's dbias (read and accumulated).
// Supported (in, out): (f32, f32), (bf16, f32), (bf16, bf16); bias may be either type in each.
struct MatmulTypes {
  MatmulDtype in = MatmulDtype::kF32;
  MatmulDtype out = MatmulDtype::kF32;
  MatmulDtype bias = MatmulDtype::kF32;
};
inline constexpr MatmulTypes kMatmulF32{MatmulDtype::kF32, MatmulDtype::kF32, MatmulDtype::kF32};
inline constexpr MatmulTypes kMatmulBf16InF32Out{MatmulDtype::kBf16, MatmulDtype::kF32, MatmulDtype::kF32};
inline constexpr MatmulTypes kMatmulBf16{MatmulDtype::kBf16, MatmulDtype::kBf16, MatmulDtype::kBf16};

// fp32 factors with a bf16 destination is the one combination left out: nothing in the trainer needs it.
inline bool MatmulTypesSupported(const MatmulTypes& t) {
  return !(t.in == MatmulDtype::kF32 && t.out == MatmulDtype::kBf16);
}

// Note [Row-major products on a column-major library]
// cuBLASLt reads matrices column-major. A row-major buffer of R rows and C columns with row stride ld is,
// read column-major, the C x R matrix with leading dimension ld: its transpose, for free. So the row-major
// product C[m,n] = op(X)[m,k] @ op(Y)[k,n] is run as its transpose, C^T = op(Y)^T @ op(X)^T, which
// cuBLASLt computes straight into the caller's row-major C buffer:
//   column-major A = the Y buffer, transa = trans_y; B = the X buffer, transb = trans_x;
//   column-major (m, n, k) = (n, m, k); lda = ldy, ldb = ldx, ldc = ldc.
// A stored matrix is described by its own rows and columns before op(): A is n x k (k x n when
// transposed), B is k x m (m x k when transposed), C and D are n x m. cuBLASLt's bias epilogue adds
// bias[i] to row i of the column-major D, which is column i of the row-major C: exactly nn.h's bias[N].
// Its BGRADA/BGRADB epilogues write rather than accumulate, so dbias has its own kernel (matmul_bias.cuh).

// A row-major product C[m,n] (=|+=) op(X)[m,k] @ op(Y)[k,n]; ld* are row strides in elements.
struct RowMajorGemm {
  bool trans_x = false, trans_y = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t ldx = 0, ldy = 0, ldc = 0;
};

// The same product as cuBLASLt runs it (column-major, see the Note): D[m,n] = op(A)[m,k] @ op(B)[k,n],
// A being the row-major call's Y operand and B its X operand.
struct ColumnMajorGemm {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t a_rows = 0, a_cols = 0, lda = 0;
  int64_t b_rows = 0, b_cols = 0, ldb = 0;
  int64_t c_rows = 0, c_cols = 0, ldc = 0;  // C and D share this layout (and buffer)
};

inline ColumnMajorGemm ToColumnMajor(const RowMajorGemm& g) {
  ColumnMajorGemm c;
  c.trans_a = g.trans_y;
  c.trans_b = g.trans_x;
  c.m = g.n;
  c.n = g.m;
  c.k = g.k;
  c.a_rows = c.trans_a ? c.k : c.m;
  c.a_cols = c.trans_a ? c.m : c.k;
  c.lda = g.ldy;
  c.b_rows = c.trans_b ? c.n : c.k;
  c.b_cols = c.trans_b ? c.k : c.n;
  c.ldb = g.ldx;
  c.c_rows = c.m;
  c.c_cols = c.n;
  c.ldc = g.ldc;
  return c;
}

// One row-major product with its operands: C (=|+=) op(X) @ op(Y), beta 0 (C written, never read) or 1.
struct RowMajorProduct {
  RowMajorGemm gemm;
  const void* x = nullptr;
  const void* y = nullptr;
  void* c = nullptr;
  float beta = 0.0f;
};

// The six products of nn.h (M, K, N as there; every buffer packed, so each row stride is a row length).
// out[M,N] (+)= a[M,K] @ w[K,N]
inline RowMajorProduct ForwardProduct(const void* a, const void* w, void* out, int64_t M, int64_t K, int64_t N,
                                      bool accumulate) {
  return {{false, false, M, N, K, K, N, N}, a, w, out, accumulate ? 1.0f : 0.0f};
}
// da[M,K] = dout[M,N] @ w[K,N]^T
inline RowMajorProduct BackwardDataProduct(const void* dout, const void* w, void* da, int64_t M, int64_t K, int64_t N) {
  return {{false, true, M, K, N, N, N, K}, dout, w, da, 0.0f};
}
// dw[K,N] += a[M,K]^T @ dout[M,N]
inline RowMajorProduct BackwardWeightProduct(const void* dout, const void* a, void* dw, int64_t M, int64_t K,
                                             int64_t N) {
  return {{true, false, K, N, M, K, N, N}, a, dout, dw, 1.0f};
}
// out[M,N] = a[M,K] @ b[N,K]^T
inline RowMajorProduct TransBForwardProduct(const void* a, const void* b, void* out, int64_t M, int64_t K, int64_t N) {
  return {{false, true, M, N, K, K, K, N}, a, b, out, 0.0f};
}
// da[M,K] = dout[M,N] @ b[N,K]
inline RowMajorProduct TransBBackwardDataProduct(const void* dout, const void* b, void* da, int64_t M, int64_t K,
                                                 int64_t N) {
  return {{false, false, M, K, N, N, K, K}, dout, b, da, 0.0f};
}
// db[N,K] += dout[M,N]^T @ a[M,K]
inline RowMajorProduct TransBBackwardWeightProduct(const void* dout, const void* a, void* db, int64_t M, int64_t K,
                                                   int64_t N) {
  return {{true, false, N, K, M, N, K, K}, dout, a, db, 1.0f};
}

// The largest power of two dividing `address`, capped at 256 (cuBLASLt's default assumption). A cached
// algorithm is only valid for operands at least as aligned as those it was chosen for, so the
// alignments are part of the key.
inline uint32_t PointerAlignment(uintptr_t address) {
  uint32_t a = 1;
  while (a < 256 && address % (2 * a) == 0) a *= 2;
  return a;
}

// Identifies one cuBLASLt plan (descriptors, layouts and the heuristic's algorithm): everything the
// heuristic's answer depends on. Bias fields are normalised when there is no fused bias, so products
// that differ only in an unused bias type share a plan.
struct MatmulKey {
  ColumnMajorGemm gemm;
  MatmulDtype in = MatmulDtype::kF32, out = MatmulDtype::kF32, bias = MatmulDtype::kF32;
  bool fused_bias = false;
  bool tf32 = false;  // fp32 factors rounded to TF32 on the tensor cores (only when in == kF32)
  uint32_t align_a = 256, align_b = 256, align_c = 256, align_bias = 256;

  // The layouts' rows and columns follow from the transposes and m, n, k, so they are not compared.
  auto Tie() const {
    const ColumnMajorGemm& g = gemm;
    return std::make_tuple(g.trans_a, g.trans_b, g.m, g.n, g.k, g.lda, g.ldb, g.ldc, in, out, bias, fused_bias, tf32,
                           align_a, align_b, align_c, align_bias);
  }
  friend bool operator==(const MatmulKey& x, const MatmulKey& y) { return x.Tie() == y.Tie(); }
  friend bool operator!=(const MatmulKey& x, const MatmulKey& y) { return !(x == y); }
};

// The key of a product; `fused_bias` says the bias goes through cuBLASLt's epilogue, `tf32` whether
// the context allows TF32 (it only matters for fp32 factors). Pointers only contribute their alignment.
inline MatmulKey MakeMatmulKey(const RowMajorGemm& g, const MatmulTypes& t, bool fused_bias, bool tf32, uintptr_t x,
                               uintptr_t y, uintptr_t c, uintptr_t bias) {
  MatmulKey key;
  key.gemm = ToColumnMajor(g);
  key.in = t.in;
  key.out = t.out;
  key.fused_bias = fused_bias;
  key.bias = fused_bias ? t.bias : MatmulDtype::kF32;
  key.tf32 = tf32 && t.in == MatmulDtype::kF32;
  key.align_a = PointerAlignment(y);  // column-major A is the row-major Y operand (the Note)
  key.align_b = PointerAlignment(x);
  key.align_c = PointerAlignment(c);
  key.align_bias = fused_bias ? PointerAlignment(bias) : 256;
  return key;
}

// A small least-recently-used map from MatmulKey to a move-only plan V. A trainer issues a dozen distinct
// products, so the entries live in a vector searched linearly. Find marks an entry used; Insert evicts the
// least recently used entry when full (destroying its V). Pointers returned stay valid until the next
// Insert. Not thread-safe: its owner (MatmulContext) is used by one thread at a time.
template <class V>
class MatmulPlanCache {
 public:
  explicit MatmulPlanCache(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}

  V* Find(const MatmulKey& key) {
    for (Entry& e : entries_) {
      if (e.key == key) {
        e.last_use = ++clock_;
        return &e.value;
      }
    }
    return nullptr;
  }

  V* Insert(const MatmulKey& key, V value) {
    if (V* existing = Find(key)) {
      *existing = std::move(value);
      return existing;
    }
    if (entries_.size() == capacity_) {
      size_t oldest = 0;
      for (size_t i = 1; i < entries_.size(); ++i) {
        if (entries_[i].last_use < entries_[oldest].last_use) oldest = i;
      }
      entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(oldest));
    }
    entries_.push_back(Entry{key, std::move(value), ++clock_});
    return &entries_.back().value;
  }

  size_t size() const { return entries_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  struct Entry {
    MatmulKey key;
    V value;
    uint64_t last_use;
  };
  size_t capacity_;
  uint64_t clock_ = 0;
  std::vector<Entry> entries_;
};

// Note [Deterministic bias gradient]
// dbias[N] += column sums of dout[M,N] runs in fixed-size row chunks: each chunk's column sums go to a
// partial row of the workspace (fp32), then one pass adds the partials in chunk order into dbias. No
// atomics, so repeated runs give the same bits. When the workspace cannot hold two partial rows, a single
// chunk sums every row and adds straight into dbias (correct, just less parallel).
inline constexpr int64_t kBiasGradRowsPerChunk = 64;
inline constexpr int64_t kBiasGradMaxChunks = 1024;

// How many row chunks the bias gradient of an M x N dout uses with `workspace_bytes` of scratch (>= 1).
inline int64_t BiasGradChunks(int64_t M, int64_t N, size_t workspace_bytes) {
  if (M <= 0 || N <= 0) return 1;
  int64_t chunks = (M + kBiasGradRowsPerChunk - 1) / kBiasGradRowsPerChunk;
  if (chunks > kBiasGradMaxChunks) chunks = kBiasGradMaxChunks;
  const int64_t fit = static_cast<int64_t>(workspace_bytes / (static_cast<size_t>(N) * sizeof(float)));
  if (chunks > fit) chunks = fit;
  return chunks < 2 ? 1 : chunks;
}

// Rows per chunk for `chunks` chunks over M rows (the last chunk may be shorter).
inline int64_t BiasGradRowsPerChunk(int64_t M, int64_t chunks) { return (M + chunks - 1) / chunks; }

}  // namespace strata::kernels::cuda
