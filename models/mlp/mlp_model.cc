#include "models/mlp/mlp_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <thread>

#include "kernels/common/element_math.h"
#include "runtime/base/status.h"

namespace strata::mlp {
namespace {

using engine::Engine;
using shard::Init;
using shard::ParamSpec;

// The bytes a micro-batch's vectors hold now and at most (Mlp::activation_peak_bytes).
struct Held {
  uint64_t now = 0, peak = 0;
};
// std::allocator, counting into a Held: every vector of TrainMicroBatch is a Vec, so its peak is measured,
// not estimated.
template <typename T>
struct Counted {
  using value_type = T;
  Held* held;
  explicit Counted(Held* h) : held(h) {}
  template <typename U>
  Counted(const Counted<U>& o) : held(o.held) {}  // NOLINT: allocators convert implicitly
  T* allocate(size_t n) {
    T* p = std::allocator<T>().allocate(n);
    held->now += n * sizeof(T);
    held->peak = std::max(held->peak, held->now);
    return p;
  }
  void deallocate(T* p, size_t n) {
    held->now -= n * sizeof(T);
    std::allocator<T>().deallocate(p, n);
  }
  friend bool operator==(const Counted& a, const Counted& b) { return a.held == b.held; }
};
using Vec = std::vector<float, Counted<float>>;

// The unit's parameters as fp32 (a copy, also of fp32 parameters).
Vec ParamF32(const Engine& e, int unit, int param, Held* held) {
  const engine::ParamView v = e.Param(unit, param);
  Vec out(v.numel, Counted<float>(held));
  const uint16_t* h = static_cast<const uint16_t*>(v.data);
  for (size_t i = 0; i < v.numel; ++i) {
    out[i] = v.dtype == DType::kF32    ? static_cast<const float*>(v.data)[i]
             : v.dtype == DType::kBF16 ? kernels::Bf16ToFloat(h[i])
                                       : kernels::HalfToFloat(h[i]);
  }
  return out;
}

// z[b][o] = sum_i W[o][i] x[b][i] + bias[o]
void Linear(const Vec& w, const Vec& bias, const Vec& x, int batch, int in, int out, Vec& z) {
  z.assign(static_cast<size_t>(batch) * out, 0.0f);
  for (int b = 0; b < batch; ++b) {
    for (int o = 0; o < out; ++o) {
      float acc = bias[o];
      for (int i = 0; i < in; ++i) acc += w[o * in + i] * x[b * in + i];
      z[b * out + o] = acc;
    }
  }
}

// Given dz (batch x out): dW += dz^T x, db += sum dz, dx = dz W.
void LinearBackward(const Vec& w, const Vec& x, const Vec& dz, int batch, int in, int out, float* dw, float* db,
                    Vec* dx) {
  for (int b = 0; b < batch; ++b) {
    for (int o = 0; o < out; ++o) {
      const float g = dz[b * out + o];
      db[o] += g;
      for (int i = 0; i < in; ++i) dw[o * in + i] += g * x[b * in + i];
    }
  }
  if (dx == nullptr) return;
  dx->assign(static_cast<size_t>(batch) * in, 0.0f);
  for (int b = 0; b < batch; ++b) {
    for (int o = 0; o < out; ++o) {
      const float g = dz[b * out + o];
      for (int i = 0; i < in; ++i) (*dx)[b * in + i] += g * w[o * in + i];
    }
  }
}

void Tanh(Vec& z) {
  for (float& v : z) v = std::tanh(v);
}

// dz = dh * (1 - h^2) for h = tanh(z).
Vec TanhBackward(const Vec& h, const Vec& dh) {
  Vec dz(h.size(), h.get_allocator());
  for (size_t i = 0; i < h.size(); ++i) dz[i] = dh[i] * (1.0f - h[i] * h[i]);
  return dz;
}

std::vector<ParamSpec> LinearSpecs(int in, int out) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(in));
  return {ParamSpec{"weight", {out, in}, true, Init::Uniform(bound)},
          ParamSpec{"bias", {out}, false, Init::Uniform(bound)}};
}

void Delay(int64_t us) {
  if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
}

}  // namespace

std::vector<MlpUnit> MlpUnits(const MlpShape& shape) {
  return {{"input", LinearSpecs(shape.in, shape.hidden)},
          {"hidden", LinearSpecs(shape.hidden, shape.hidden)},
          {"output", LinearSpecs(shape.hidden, shape.out)}};
}

absl::StatusOr<Mlp> Mlp::Register(Engine& engine, const MlpShape& shape, bool perturb_for_test) {
  Mlp m;
  m.shape_ = shape;
  std::vector<MlpUnit> units = MlpUnits(shape);
  // perturb_for_test: this rank registers a different hidden width (registration mismatch test).
  if (perturb_for_test) units[1].params = LinearSpecs(shape.hidden, shape.hidden + 1);
  int* const ids[] = {&m.input_, &m.hidden_, &m.output_};
  for (size_t u = 0; u < units.size(); ++u) {
    STRATA_ASSIGN_OR_RETURN(*ids[u], engine.RegisterUnit(std::move(units[u].name), std::move(units[u].params)));
  }
  return m;
}

void Mlp::Sample(int64_t index, float* x, float* t) const {
  for (int i = 0; i < shape_.in; ++i) {
    const uint64_t key = static_cast<uint64_t>(index) * 1315423911ull + static_cast<uint64_t>(i) * 2654435761ull;
    x[i] = 2.0f * shard::InitValue(Init::Uniform(0.5f), 12345, key, 0);  // uniform in (-1, 1)
  }
  for (int o = 0; o < shape_.out; ++o) {
    float acc = 0;
    for (int i = 0; i < shape_.in; ++i) acc += std::sin(0.7f * (o + 1) + 0.3f * i) * x[i];
    t[o] = std::sin(acc);
  }
}

absl::StatusOr<double> Mlp::TrainMicroBatch(Engine& e, int64_t first, int count, int64_t delay_us) {
  const int in = shape_.in, hid = shape_.hidden, out = shape_.out;
  Held held;  // declared first: it outlives every vector below
  const Counted<float> a(&held);
  auto W = [&](int unit, int param) { return ParamF32(e, unit, param, &held); };
  Vec x(static_cast<size_t>(count) * in, a), t(static_cast<size_t>(count) * out, a);
  for (int b = 0; b < count; ++b) Sample(first + b, &x[b * in], &t[b * out]);

  // Forward: h0 = tanh(L0 x), h1 = tanh(L1 h0), h2 = tanh(L1 h1), y = L2 h2.
  Vec h0(a), h1(a), h2(a), y(a);
  STRATA_RETURN_IF_ERROR(e.BeginForward(input_));
  Linear(W(input_, 0), W(input_, 1), x, count, in, hid, h0);
  Tanh(h0);
  Delay(delay_us);
  STRATA_RETURN_IF_ERROR(e.EndForward(input_));
  for (Vec* io : {&h1, &h2}) {
    const Vec& src = io == &h1 ? h0 : h1;
    STRATA_RETURN_IF_ERROR(e.BeginForward(hidden_));
    Linear(W(hidden_, 0), W(hidden_, 1), src, count, hid, hid, *io);
    Tanh(*io);
    Delay(delay_us);
    STRATA_RETURN_IF_ERROR(e.EndForward(hidden_));
  }
  STRATA_RETURN_IF_ERROR(e.BeginForward(output_));
  Linear(W(output_, 0), W(output_, 1), h2, count, hid, out, y);
  Delay(delay_us);
  STRATA_RETURN_IF_ERROR(e.EndForward(output_));

  double loss = 0;
  Vec dy(y.size(), a);
  for (size_t i = 0; i < y.size(); ++i) {
    const float d = y[i] - t[i];
    loss += 0.5 * static_cast<double>(d) * d;
    dy[i] = d / static_cast<float>(count);
  }
  loss /= count;

  // Backward, in reverse order of use.
  Vec dh2(a), dh1(a), dh0(a);
  STRATA_RETURN_IF_ERROR(e.BeginBackward(output_));
  LinearBackward(W(output_, 0), h2, dy, count, hid, out, e.Grad(output_, 0), e.Grad(output_, 1), &dh2);
  Delay(delay_us);
  STRATA_RETURN_IF_ERROR(e.EndBackward(output_));
  STRATA_RETURN_IF_ERROR(e.BeginBackward(hidden_));
  LinearBackward(W(hidden_, 0), h1, TanhBackward(h2, dh2), count, hid, hid, e.Grad(hidden_, 0), e.Grad(hidden_, 1),
                 &dh1);
  Delay(delay_us);
  STRATA_RETURN_IF_ERROR(e.EndBackward(hidden_));
  STRATA_RETURN_IF_ERROR(e.BeginBackward(hidden_));
  LinearBackward(W(hidden_, 0), h0, TanhBackward(h1, dh1), count, hid, hid, e.Grad(hidden_, 0), e.Grad(hidden_, 1),
                 &dh0);
  Delay(delay_us);
  STRATA_RETURN_IF_ERROR(e.EndBackward(hidden_));
  STRATA_RETURN_IF_ERROR(e.BeginBackward(input_));
  LinearBackward(W(input_, 0), x, TanhBackward(h0, dh0), count, in, hid, e.Grad(input_, 0), e.Grad(input_, 1), nullptr);
  Delay(delay_us);
  STRATA_RETURN_IF_ERROR(e.EndBackward(input_));
  activation_peak_bytes_ = std::max(activation_peak_bytes_, held.peak);
  return loss;
}

}  // namespace strata::mlp
