// The per-step hooks of the C ABI: micro-batches, begin / end of each unit's forward and backward use
// (handing out the gathered parameter and gradient pointers), zero_grad, step, and the step's wall clock
// that completes the engine's time split in strata_stats.
//
// The wrapper keeps its own count of open uses per unit, on top of the engine's checks, for two reasons:
// strata_engine_param / strata_engine_grad must refuse outside the periods the pointers are valid in, and
// end_forward must not close a backward use (the engine counts both kinds together). The pointer arrays
// are cleared to NULL when a unit's last open use ends, so a stale pointer read fails loudly.
#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/capi/capi_internal.h"
#include "runtime/checkpoint/async_save.h"

namespace strata::capi {
namespace {

constexpr size_t kUnitBuffersV1 = offsetof(strata_unit_buffers, grads) + sizeof(void*);
constexpr size_t kStepResultV1 = offsetof(strata_step_result, loss_scale) + sizeof(double);

// The step's wall time runs from the return of the previous step (or the first hook of the first one).
void MarkStepStart(strata_engine& e) {
  if (e.clock.step_begin_ns == 0) e.clock.step_begin_ns = device::NowNs();
}

// Closes the step's accounting when strata_engine_step returns: the engine's own split of the step
// (the same numbers `strata train` reports), plus the wall time and the remainder.
void FinishStep(strata_engine& e, const engine::StepResult& r) {
  strata_step_clock& c = e.clock;
  const int64_t now = device::NowNs();
  const double wall = 1e-6 * static_cast<double>(now - c.step_begin_ns);
  const double other = wall - r.compute_ms - r.exposed_comm_ms - r.exposed_io_ms - r.optimizer_ms;
  const double split[6] = {wall, r.compute_ms, r.exposed_comm_ms, r.exposed_io_ms, r.optimizer_ms,
                           std::max(0.0, other)};
  std::copy(split, split + 6, c.last_ms);
  c.step_begin_ns = now;
}

absl::Status MicroBatch(strata_engine* e, bool begin) {
  STRATA_RETURN_IF_ERROR(CheckEngine(e));
  if (!e->finalized) return absl::FailedPreconditionError("called before strata_engine_finalize");
  MarkStepStart(*e);
  const absl::Status s = begin ? e->engine->BeginMicroBatch() : e->engine->EndMicroBatch();
  STRATA_RETURN_IF_ERROR(s);
  e->in_micro_batch = begin;
  if (!begin) ++e->micro_batches_done;
  return absl::OkStatus();
}

absl::Status BeginUse(strata_engine* e, int32_t unit, bool backward, strata_unit_buffers* out) {
  STRATA_RETURN_IF_ERROR(CheckFinalizedUnit(e, unit));
  if (out != nullptr) STRATA_RETURN_IF_ERROR(CheckOutput(out, kUnitBuffersV1, "out"));
  MarkStepStart(*e);
  const absl::Status s = backward ? e->engine->BeginBackward(unit) : e->engine->BeginForward(unit);
  STRATA_RETURN_IF_ERROR(s);
  strata_unit_state& u = e->units[unit];
  ++(backward ? u.open_backward : u.open_forward);
  ++e->open_uses;
  for (size_t i = 0; i < u.params.size(); ++i) {
    u.params[i] = e->engine->Param(unit, static_cast<int>(i)).data;
    if (backward) u.grads[i] = e->engine->Grad(unit, static_cast<int>(i));
  }
  if (out != nullptr) {
    strata_unit_buffers b = STRATA_UNIT_BUFFERS_INIT;
    b.num_params = static_cast<int32_t>(u.params.size());
    b.param_dtype = ToCDType(e->engine->config().param_dtype);
    b.params = u.params.data();
    b.grads = backward ? u.grads.data() : nullptr;
    WriteVersioned(b, out);
  }
  return absl::OkStatus();
}

absl::Status EndUse(strata_engine* e, int32_t unit, bool backward) {
  STRATA_RETURN_IF_ERROR(CheckFinalizedUnit(e, unit));
  strata_unit_state& u = e->units[unit];
  int& open = backward ? u.open_backward : u.open_forward;
  if (open == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("unit '", e->engine->layout(unit).name, "' has no open ", backward ? "backward" : "forward",
                     " use (call strata_engine_begin_", backward ? "backward" : "forward", " first)"));
  }
  const absl::Status s = backward ? e->engine->EndBackward(unit) : e->engine->EndForward(unit);
  // The engine closed the use before anything in it could fail (a later failure poisons the engine).
  --open;
  --e->open_uses;
  if (u.open_backward == 0) std::fill(u.grads.begin(), u.grads.end(), nullptr);
  if (u.open_forward + u.open_backward == 0) std::fill(u.params.begin(), u.params.end(), nullptr);
  return s;
}

// Parameter (grad=false) or gradient pointer of an open use.
absl::Status Pointer(const strata_engine* e, int32_t unit, int32_t param, bool grad, void** out) {
  STRATA_RETURN_IF_ERROR(CheckFinalizedParam(e, unit, param));
  if (out == nullptr) return NullArgument("out");
  *out = nullptr;
  const strata_unit_state& u = e->units[unit];
  const bool open = grad ? u.open_backward > 0 : u.open_forward + u.open_backward > 0;
  if (!open) {
    return absl::FailedPreconditionError(absl::StrCat(
        "unit '", e->engine->layout(unit).name, "' is not between ",
        grad ? "strata_engine_begin_backward and its end: gradients exist only there"
             : "a begin and its end: its parameters are not gathered"));
  }
  if (grad && e->engine->layout(unit).frozen()) {
    return absl::FailedPreconditionError(absl::StrCat("unit '", e->engine->layout(unit).name,
                                                      "' is frozen: it has no gradients"));
  }
  *out = grad ? static_cast<void*>(u.grads[param]) : u.params[param];
  return absl::OkStatus();
}

absl::Status Step(strata_engine* e, strata_step_result* out) {
  STRATA_RETURN_IF_ERROR(CheckEngine(e));
  if (out != nullptr) STRATA_RETURN_IF_ERROR(CheckOutput(out, kStepResultV1, "out"));
  if (!e->finalized) return absl::FailedPreconditionError("called before strata_engine_finalize");
  if (e->in_micro_batch) return absl::FailedPreconditionError("inside an open micro-batch (call end_micro_batch)");
  const int accum = e->engine->config().gradient_accumulation_steps;
  if (e->micro_batches_done != accum) {
    return absl::FailedPreconditionError(absl::StrCat("after ", e->micro_batches_done, " micro-batches, but "
                                                      "gradient_accumulation_steps is ", accum));
  }
  absl::StatusOr<engine::StepResult> r = e->engine->Step();
  // A failed asynchronous checkpoint is returned before the step is taken, which may be called again.
  if (!checkpoint::IsAsyncSaveFailure(r.status())) e->micro_batches_done = 0;
  STRATA_RETURN_IF_ERROR(r.status());
  FinishStep(*e, *r);
  RecordStepTrace(*e);
  if (out != nullptr) {
    strata_step_result c = STRATA_STEP_RESULT_INIT;
    c.step = r->step;
    c.skipped = r->skipped ? 1 : 0;
    c.clip_coef = r->clip_coef;
    c.grad_norm = r->grad_norm;
    c.lr = r->lr;
    c.loss_scale = r->loss_scale;
    WriteVersioned(c, out);
  }
  return absl::OkStatus();
}

absl::Status ZeroGrad(strata_engine* e) {
  STRATA_RETURN_IF_ERROR(CheckEngine(e));
  if (!e->finalized) return absl::FailedPreconditionError("called before strata_engine_finalize");
  if (e->in_micro_batch || e->micro_batches_done > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "gradients of ", e->micro_batches_done + (e->in_micro_batch ? 1 : 0), " micro-batch(es) of this step are "
        "accumulated and partly reduced across ranks; they cannot be discarded. The engine zeroes the gradients "
        "at every strata_engine_step: call zero_grad only before a step's first micro-batch"));
  }
  return absl::OkStatus();  // zero already: at creation and after every step
}

}  // namespace
}  // namespace strata::capi

using namespace strata::capi;  // NOLINT: the entry points below are thin wrappers

extern "C" {

strata_status strata_engine_begin_micro_batch(strata_engine* engine) {
  return Call(__func__, [&] { return MicroBatch(engine, /*begin=*/true); });
}
strata_status strata_engine_end_micro_batch(strata_engine* engine) {
  return Call(__func__, [&] { return MicroBatch(engine, /*begin=*/false); });
}
strata_status strata_engine_begin_forward(strata_engine* engine, int32_t unit, strata_unit_buffers* out) {
  return Call(__func__, [&] { return BeginUse(engine, unit, /*backward=*/false, out); });
}
strata_status strata_engine_end_forward(strata_engine* engine, int32_t unit) {
  return Call(__func__, [&] { return EndUse(engine, unit, /*backward=*/false); });
}
strata_status strata_engine_begin_backward(strata_engine* engine, int32_t unit, strata_unit_buffers* out) {
  return Call(__func__, [&] { return BeginUse(engine, unit, /*backward=*/true, out); });
}
strata_status strata_engine_end_backward(strata_engine* engine, int32_t unit) {
  return Call(__func__, [&] { return EndUse(engine, unit, /*backward=*/true); });
}
strata_status strata_engine_mark_no_grad(strata_engine* engine, int32_t unit, int32_t param) {
  return Call(__func__, [&] {
    STRATA_RETURN_IF_ERROR(CheckFinalizedUnit(engine, unit));
    return engine->engine->MarkNoGrad(unit, param);
  });
}
strata_status strata_engine_param(const strata_engine* engine, int32_t unit, int32_t param, void** out) {
  return Call(__func__, [&] { return Pointer(engine, unit, param, /*grad=*/false, out); });
}
strata_status strata_engine_grad(const strata_engine* engine, int32_t unit, int32_t param, float** out) {
  return Call(__func__, [&]() -> absl::Status {
    void* p = nullptr;
    const absl::Status s = Pointer(engine, unit, param, /*grad=*/true, out == nullptr ? nullptr : &p);
    if (out != nullptr) *out = static_cast<float*>(p);
    return s;
  });
}
strata_status strata_engine_zero_grad(strata_engine* engine) {
  return Call(__func__, [&] { return ZeroGrad(engine); });
}
strata_status strata_engine_step(strata_engine* engine, strata_step_result* out) {
  return Call(__func__, [&] { return Step(engine, out); });
}

}  // extern "C"
