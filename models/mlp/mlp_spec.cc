#include "models/mlp/mlp_spec.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/device/host_device.h"

namespace strata::mlp {
namespace {

constexpr int kMaxWidth = 1 << 20;

class Spec final : public spec::ModelSpec {
 public:
  explicit Spec(const MlpShape& s) : s_(s) {}

  absl::Status Validate() const override {
    for (const int d : {s_.in, s_.hidden, s_.out}) {
      if (d < 1 || d > kMaxWidth)
        return absl::InvalidArgumentError(absl::StrCat("MLP ", Describe(), ": widths in [1, 2^20]"));
    }
    return absl::OkStatus();
  }
  std::string Describe() const override { return absl::StrCat("in ", s_.in, ", hidden ", s_.hidden, ", out ", s_.out); }
  std::string Shape() const override { return absl::StrCat("hidden ", s_.hidden); }
  std::vector<spec::Dimension> Dimensions() const override {
    return {{"hidden", s_.hidden}, {"in", s_.in}, {"out", s_.out}};
  }
  int64_t NumParams() const override {
    const int64_t i = s_.in, h = s_.hidden, o = s_.out;
    return (i * h + h) + (h * h + h) + (h * o + o);
  }
  int SequenceLength() const override { return 1; }

  std::vector<spec::UnitSpec> Units() const override {
    std::vector<spec::UnitSpec> out;
    for (MlpUnit& u : MlpUnits(s_)) out.push_back({std::move(u.name), std::move(u.params)});
    return out;
  }
  // Mlp::TrainMicroBatch's vectors at their peak, which the model measures (Mlp::activation_peak_bytes;
  // tests/spec/family_conformance_test.cc holds the two equal). Host memory whatever the target, in floats:
  // the samples and targets B (i + o) throughout; then per use, what is live while it runs (earlier
  // activations and gradients, the fp32 copies of the unit's parameters, the vector it writes):
  //   forward:  input  Bh + hi + h;  hidden  2Bh + Bh + h^2 + h (second use);  output  3Bh + Bo + ho + o
  //   backward: output 3Bh + 2Bo (y, dy) + ho + Bh;  hidden 5Bh + 2Bo + h^2 + Bh (tanh's) + Bh (second use);
  //             input  6Bh + 2Bo + hi + Bh (tanh's).
  uint64_t ActivationBytes(int micro_batch, bool, const spec::ComputeTarget&) const override {
    const uint64_t B = micro_batch, i = s_.in, h = s_.hidden, o = s_.out;
    const uint64_t uses[] = {B * h + h * i + h,
                             3 * B * h + h * h + h,
                             3 * B * h + B * o + h * o + o,
                             4 * B * h + 2 * B * o + h * o,
                             7 * B * h + 2 * B * o + h * h,
                             7 * B * h + 2 * B * o + h * i};
    return 4 * (B * (i + o) + *std::max_element(std::begin(uses), std::end(uses)));
  }
  uint64_t UnitCopyBytes(DType, size_t) const override { return 0; }

  double ForwardFlopsPerToken() const override {
    return 2.0 * (double(s_.in) * s_.hidden + 2.0 * s_.hidden * s_.hidden + double(s_.hidden) * s_.out);
  }
  // input, hidden, hidden again (tied), output; backward the reverse. The hidden unit's gradient is
  // complete after its second backward use.
  spec::StepUses Uses(int micro_batch) const override {
    const double B = micro_batch, i = s_.in, h = s_.hidden, o = s_.out;
    const double in_f = 2 * B * i * h, hid_f = 2 * B * h * h, out_f = 2 * B * h * o;
    spec::StepUses u;
    u.forward = {{0, in_f}, {1, hid_f}, {1, hid_f}, {2, out_f}};
    u.backward = {{2, out_f, false, true}, {1, hid_f, false, false}, {1, hid_f, false, true}, {0, in_f, false, true}};
    return u;
  }
  spec::Product HostProduct(int micro_batch) const override { return {micro_batch, s_.hidden, s_.hidden}; }
  // The example's products are plain loops: time one, [m, k] x [k, n], as Linear computes it.
  double HostProductGflops(const spec::Product& p, double seconds) const override {
    std::vector<float> a(size_t(p.m) * p.k, 0.5f), w(size_t(p.k) * p.n, 0.25f), z(size_t(p.m) * p.n);
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    int reps = 0;
    double secs = 0;
    do {
      for (int r = 0; r < p.m; ++r) {
        for (int c = 0; c < p.n; ++c) {
          float acc = 0;
          for (int k = 0; k < p.k; ++k) acc += a[size_t(r) * p.k + k] * w[size_t(c) * p.k + k];
          z[size_t(r) * p.n + c] = acc;
        }
      }
      ++reps;
      secs = std::chrono::duration<double>(Clock::now() - t0).count();
    } while (secs < seconds);
    return 2.0 * p.m * p.k * p.n * reps / secs / 1e9;
  }

  // It grows in width only (its depth is fixed at three layers, the hidden one used twice).
  spec::Growth Grows(bool width) const override {
    return width ? spec::Growth{"hidden", s_.hidden, kMaxWidth} : spec::Growth{"layers", 1, 1};
  }
  std::shared_ptr<const spec::ModelSpec> Scaled(bool width, int64_t k) const override {
    MlpShape s = s_;
    if (width) s.hidden = static_cast<int>(k);
    return MlpSpec(s);
  }

  const MlpShape& shape() const { return s_; }

 private:
  MlpShape s_;
};

class Trainer final : public spec::Trainer {
 public:
  Trainer(std::unique_ptr<engine::Engine> e, Mlp m) : e_(std::move(e)), m_(std::move(m)) {}
  engine::Engine& engine() override { return *e_; }
  void SynthesizeTokens(uint32_t seed, int micro) override {
    first_ = int64_t{seed} * micro;  // the samples are a pure function of their index
    micro_ = micro;
  }
  absl::StatusOr<double> RunMicroBatches(int count, bool) override {
    double loss = 0;
    for (int a = 0; a < count; ++a) {
      STRATA_RETURN_IF_ERROR(e_->BeginMicroBatch());
      STRATA_ASSIGN_OR_RETURN(const double l, m_.TrainMicroBatch(*e_, first_ + int64_t{a} * micro_, micro_));
      STRATA_RETURN_IF_ERROR(e_->EndMicroBatch());
      loss += l / count;
    }
    return loss;
  }
  spec::Facts facts() const override { return {{"matmul", "fp32"}}; }
  uint64_t activation_bytes() const override { return m_.activation_peak_bytes(); }

 private:
  std::unique_ptr<engine::Engine> e_;
  Mlp m_;
  int64_t first_ = 0;
  int micro_ = 1;
};

class HostCompute final : public spec::Compute {
 public:
  device::Device& device() override { return dev_; }
  bool gpu() const override { return false; }
  std::string name() const override { return "host"; }
  absl::StatusOr<double> Bf16MatmulFlops() override {
    return absl::FailedPreconditionError("the MLP runs on the host only");
  }

 private:
  device::HostDevice dev_;
};

class Setup final : public spec::TrainSetup {
 public:
  device::DeviceKind device_kind() const override { return device::DeviceKind::kHost; }
  absl::StatusOr<std::unique_ptr<spec::Compute>> MakeCompute(std::optional<int>) const override {
    return std::make_unique<HostCompute>();
  }
};

std::vector<spec::FlagDef> Defs() {
  return {{"in", false, "input width (default 16)"},
          {"hidden", false, "hidden width (default 48)"},
          {"out", false, "output width (default 4)"},
          {"stage", false, "ZeRO stage 0-3 (default 3)"},
          {"micro-batch", false, "samples per rank per micro-batch"},
          {"grad-accum", false, "micro-batches per step"},
          {"steps", false, "optimizer steps (default 200)"},
          {"param-dtype", false, "fp32 | bf16 | fp16"},
          {"offload-params", false, "none | cpu | nvme"},
          {"offload-optimizer", false, "none | cpu | nvme"},
          {"nvme-path", false, "directory for NVMe-offloaded state"},
          {"device-budget", false, "bytes of the device tier (e.g. 512MiB): host memory, the MLP runs on the host"},
          {"host-budget", false, "bytes of pinned host memory"}};
}

class Family final : public spec::Family {
 public:
  std::string name() const override { return "mlp"; }
  std::vector<spec::FlagDef> TrainFlagDefs() const override { return Defs(); }
  absl::StatusOr<std::unique_ptr<spec::TrainSetup>> ParseTrain(const std::vector<std::string>& args,
                                                               int world_size) const override {
    STRATA_ASSIGN_OR_RETURN(const spec::Flags f, spec::Flags::Parse(args, Defs()));
    if (!f.positional().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", f.positional()[0], "'"));
    }
    MlpShape s;
    STRATA_ASSIGN_OR_RETURN(const int64_t in, f.IntIn("in", s.in, 1, kMaxWidth));
    STRATA_ASSIGN_OR_RETURN(const int64_t hidden, f.IntIn("hidden", s.hidden, 1, kMaxWidth));
    STRATA_ASSIGN_OR_RETURN(const int64_t out, f.IntIn("out", s.out, 1, kMaxWidth));
    s = MlpShape{int(in), int(hidden), int(out)};
    auto setup = std::make_unique<Setup>();
    STRATA_ASSIGN_OR_RETURN(setup->steps, f.IntIn("steps", 200, 0, int64_t{1} << 40));
    std::vector<std::string> o;  // the flags' config keys, as strata train maps them
    for (const auto& [flag, key] : {std::pair<const char*, const char*>{"stage", "zero_optimization.stage"},
                                    {"micro-batch", "train_micro_batch_size_per_gpu"},
                                    {"grad-accum", "gradient_accumulation_steps"},
                                    {"param-dtype", "strata.param_dtype"},
                                    {"offload-params", "zero_optimization.offload_param.device"},
                                    {"offload-optimizer", "zero_optimization.offload_optimizer.device"},
                                    {"nvme-path", "zero_optimization.offload_param.nvme_path"},
                                    {"nvme-path", "zero_optimization.offload_optimizer.nvme_path"},
                                    {"device-budget", "strata.device_budget"},
                                    {"host-budget", "strata.host_budget"}}) {
      if (f.Has(flag)) o.push_back(absl::StrCat(key, "=", f.Str(flag)));
    }
    if (f.Str("param-dtype") == "bf16") o.push_back("bf16.enabled=true");
    if (f.Str("param-dtype") == "fp16") o.push_back("fp16.enabled=true");
    engine::ConfigFacts facts;
    facts.world_size = world_size;
    facts.hidden_size = s.hidden;
    facts.total_steps = setup->steps;
    STRATA_ASSIGN_OR_RETURN(setup->engine,
                            engine::ParseConfigWithOverrides(R"({"zero_optimization": {"stage": 3}})", o, facts));
    setup->model = MlpSpec(s);
    STRATA_RETURN_IF_ERROR(setup->model->Validate());
    return setup;
  }
  absl::StatusOr<std::unique_ptr<spec::Trainer>> BringUp(const spec::ModelSpec& model,
                                                         const engine::EngineConfig& config, comm::Communicator& world,
                                                         device::Device& dev, spec::Compute*) const override {
    const auto* mine = dynamic_cast<const Spec*>(&model);
    if (mine == nullptr) return absl::InvalidArgumentError("the mlp family brings up MLPs only (MlpSpec)");
    STRATA_ASSIGN_OR_RETURN(auto e, engine::Engine::Create(config, world, dev));
    STRATA_ASSIGN_OR_RETURN(Mlp m, Mlp::Register(*e, mine->shape()));
    STRATA_RETURN_IF_ERROR(e->Finalize());
    return std::make_unique<Trainer>(std::move(e), std::move(m));
  }
};

}  // namespace

std::shared_ptr<const spec::ModelSpec> MlpSpec(const MlpShape& shape) { return std::make_shared<Spec>(shape); }

std::unique_ptr<spec::Family> MakeMlpFamily() { return std::make_unique<Family>(); }

}  // namespace strata::mlp
