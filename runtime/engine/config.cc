// Engine configuration parsing: JSON text -> validated EngineConfig.
//
// One schema tree (Schema()) lists every valid key; it drives the unknown-key check at each level (with
// a Levenshtein "did you mean", or the judgement of config_deepspeed.cc for DeepSpeed's other keys) and
// ValidKeyPaths(). Each section is then read by typed getters that name the full key path in type and range
// errors. Every problem is collected and the config refused once (Note [One pass, every problem]). Every
// error is InvalidArgument (NotFound for a missing file); nlohmann exceptions never escape.
//
// Decisions beyond DeepSpeed's documentation (docs/decisions/0028-deepspeed-config-semantics.md):
//  - Missing keys have DeepSpeed's defaults (JsonDefaults(), Note [Two sets of defaults]); "Adam" follows
//    adam_w_mode (default true: decoupled decay), "AdamW" is always decoupled, as DeepSpeed.
//  - train_batch_size is stored and the batch triangle resolved where the world size is known
//    (ResolveBatchSizes, config_deepspeed.cc). Without train_batch_size and the micro-batch, the micro-batch
//    is 1 (DeepSpeed refuses that config).
//  - Precision: bf16.enabled / fp16.enabled set param_dtype; strata.param_dtype may restate it but not
//    contradict it (including an explicit "enabled": false). strata.param_dtype "fp16" needs
//    fp16.enabled (loss scaling lives there). After parsing, bf16 == (param_dtype == bf16) and
//    fp16.enabled == (param_dtype == fp16).
//  - The scheduler block is DeepSpeed's lr_schedules with their parameters and defaults (warmup_type "log");
//    total_num_steps <= warmup_num_steps is refused (DeepSpeed only warns: the schedule would never decay).
//  - offload_param needs stage 3 and offload_optimizer needs stage >= 1, as in DeepSpeed.
//  - Integer keys accept integral floats (DeepSpeed configs often say 1e5) and are range-checked against
//    their field, never narrowed; duplicate keys are an error (DeepSpeed rejects them too), and so is
//    nesting past 64 levels (runtime/base/json_text.h, docs/decisions/0010). ParseConfigWithOverrides treats empty text
//    as {}; ParseConfig does not.
#include "runtime/engine/config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "kernels/cpu/thread_pool.h"
#include "runtime/base/input_file.h"
#include "runtime/base/json_text.h"
#include "runtime/base/nearest.h"
#include "runtime/base/status.h"
#include "runtime/base/units.h"
#include "runtime/engine/config_deepspeed.h"
#include "runtime/engine/config_overrides.h"
#include "runtime/optim/optimizer.h"

namespace strata::engine {
namespace {

using json = nlohmann::json;
constexpr double kInf = std::numeric_limits<double>::infinity();
// About 31 years: a deadline of now + this many ms still fits std::chrono's nanosecond clocks.
constexpr double kMaxTimeoutMs = 1e12;

// ---------------------------------------------------------------------------------------------------
// Schema.

struct KeyNode {
  KeyNode(const char* key, std::vector<KeyNode> sub = {}) : name(key), children(std::move(sub)) {}

  const char* name;
  std::vector<KeyNode> children;  // empty: a leaf (scalar, array, or an ignored value of any type)
};

KeyNode OffloadNode(const char* name) {
  return {name, {{"device"}, {"nvme_path"}, {"pin_memory"}, {"buffer_count"}}};
}

const KeyNode& Schema() {
  // clang-format off
  static const KeyNode* const kRoot = new KeyNode{"", {
      {"train_micro_batch_size_per_gpu"}, {"gradient_accumulation_steps"}, {"gradient_clipping"},
      {"train_batch_size"},
      {"bf16", {{"enabled"}}},
      {"fp16", {{"enabled"}, {"loss_scale"}, {"initial_scale_power"}, {"loss_scale_window"},
                {"hysteresis"}, {"consecutive_hysteresis"}, {"min_loss_scale"}}},
      {"optimizer", {{"type"}, {"params", {{"lr"}, {"betas"}, {"eps"}, {"weight_decay"}, {"momentum"},
                                           {"adam_w_mode"}, {"torch_adam"}}}}},
      {"scheduler", {{"type"}, {"params", {{"warmup_min_lr"}, {"warmup_max_lr"}, {"warmup_num_steps"},
                                           {"total_num_steps"}, {"warmup_type"}, {"cos_min_ratio"},
                                           {"warmup_min_ratio"}}}}},
      // DeepSpeed's tuning keys are not here: config_deepspeed.cc judges them (Note [DeepSpeed keys Strata
      // does not read]).
      {"zero_optimization", {
          {"stage"}, OffloadNode("offload_param"), OffloadNode("offload_optimizer"), {"shard_group_size"}}},
      {"strata", {{"param_dtype"}, {"reduce_dtype"}, {"max_live_units"}, {"prefetch_depth"},
                  {"reshard_after_forward"}, {"collective_timeout_ms"}, {"seed"}, {"device_budget"},
                  {"host_budget"}, {"optimizer_threads"}, {"optimizer_in_backward"},
                  {"release_idle_memory"}, {"params_without_grad"}, {"weight_decay_1d"}}},
  }};
  // clang-format on
  return *kRoot;
}

// The public API takes std::string_view; the installed Abseil's string_view is a distinct type.
absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

std::string JoinPath(const std::string& prefix, absl::string_view key) {
  return prefix.empty() ? std::string(key) : absl::StrCat(prefix, ".", key);
}

void CollectPaths(const KeyNode& node, const std::string& prefix, std::vector<std::string>* out) {
  for (const KeyNode& child : node.children) {
    const std::string path = JoinPath(prefix, child.name);  // not a reference into *out: it grows
    out->push_back(path);
    CollectPaths(child, path, out);
  }
}

// ---------------------------------------------------------------------------------------------------
// Error messages.

absl::Status UnknownKeyError(const std::string& prefix, const std::string& key, const KeyNode& node) {
  std::vector<std::string> names;
  for (const KeyNode& child : node.children) names.push_back(child.name);
  const std::optional<std::string> best = NearestMatch(key, names);
  const bool close = best.has_value();
  const std::string path = JoinPath(prefix, key);
  if (close) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown config key '", path, "'; did you mean '", JoinPath(prefix, *best), "'?"));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown config key '", path, "'; valid keys",
                                                 prefix.empty() ? "" : absl::StrCat(" in '", prefix, "'"),
                                                 ": ", absl::StrJoin(names, ", ")));
}

std::string Shown(const json& v) {
  // A value from --set may hold any bytes; invalid UTF-8 is shown replaced (dump() would throw on it).
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 60) text = absl::StrCat(text.substr(0, 57), "...");
  return text;
}

absl::Status TypeError(const std::string& path, absl::string_view expected, const json& v) {
  if (v.is_string() && v.get<std::string>() == "auto") {  // Note ["auto"], config_deepspeed.h
    return absl::InvalidArgumentError(absl::StrCat("config key '", path, "' is \"auto\", which Strata does not "
                                                   "resolve for this key: set it to ", expected));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("config key '", path, "' must be ", expected, ", got ", v.type_name(), " ", Shown(v)));
}

absl::Status RangeError(const std::string& path, const json& v, absl::string_view allowed) {
  return absl::InvalidArgumentError(
      absl::StrCat("config key '", path, "' is ", Shown(v), ", but must be ", allowed));
}

absl::Status KeyError(const std::string& path, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("config key '", path, "' ", why));
}

// A numeric interval; an infinite end is unbounded.
struct Range {
  double lo = -kInf;
  double hi = kInf;
  bool lo_open = false;
  bool hi_open = false;

  bool Contains(double x) const { return (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi); }
  std::string ToString() const {
    if (hi == kInf) return absl::StrCat(lo_open ? "> " : ">= ", lo);
    return absl::StrCat("in ", lo_open ? "(" : "[", lo, ", ", hi, hi_open ? ")" : "]");
  }
};
Range AtLeast(double lo) { return {lo, kInf, false, false}; }
Range Above(double lo) { return {lo, kInf, true, false}; }
Range Closed(double lo, double hi) { return {lo, hi, false, false}; }
Range HalfOpen(double lo, double hi) { return {lo, hi, false, true}; }

bool IsIntegral(double d, double limit) {
  return std::isfinite(d) && d == std::trunc(d) && std::fabs(d) < limit;
}

absl::StatusOr<int64_t> AsInt64(const json& v, const std::string& path) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(kMax)) return RangeError(path, v, absl::StrCat("<= ", kMax));
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float() && IsIntegral(v.get<double>(), 9.2e18)) {
    return static_cast<int64_t>(v.get<double>());
  }
  return TypeError(path, "an integer", v);
}

absl::StatusOr<uint64_t> AsUint64(const json& v, const std::string& path) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  const bool integral = v.is_number_integer() || (v.is_number_float() && IsIntegral(v.get<double>(), 1.8e19));
  if (!integral) return TypeError(path, "a non-negative integer", v);
  if (v.get<double>() < 0) return RangeError(path, v, ">= 0");
  if (v.is_number_integer()) return static_cast<uint64_t>(v.get<int64_t>());
  return static_cast<uint64_t>(v.get<double>());
}

// ---------------------------------------------------------------------------------------------------
// Section: one JSON object at a key path, checked against its schema node. An absent section has no
// object; every getter then leaves its output unchanged.

// Note [One pass, every problem]: every problem of a config is collected, not just the first: each unknown
// key at every level, each getter's type or range error, and the first cross-key error of each section.
// The config is refused once, with all of them.
class Problems {
 public:
  void Add(const absl::Status& s) {
    if (!s.ok()) messages_.emplace_back(s.message());
  }
  void Add(std::string message) { messages_.push_back(std::move(message)); }
  // A problem with the key at `path`: checks that read it with others are then skipped (no second,
  // derived complaint about a value the config never had).
  void Add(const std::string& path, const absl::Status& s) {
    if (s.ok()) return;
    failed_.push_back(path);
    Add(s);
  }
  bool Failed(const std::string& path) const {
    return std::find(failed_.begin(), failed_.end(), path) != failed_.end();
  }
  void NoEffect(std::string path) { no_effect_.push_back(std::move(path)); }
  bool empty() const { return messages_.empty(); }
  const std::vector<std::string>& no_effect() const { return no_effect_; }
  absl::Status Error() const {
    if (messages_.size() == 1) return absl::InvalidArgumentError(messages_[0]);
    return absl::InvalidArgumentError(absl::StrCat("the config has ", messages_.size(), " problems:\n  ",
                                                   absl::StrJoin(messages_, "\n  ")));
  }

 private:
  std::vector<std::string> messages_;
  std::vector<std::string> failed_;
  std::vector<std::string> no_effect_;
};

class Section {
 public:
  // Always a section: a value that is not an object is a problem, and the section is then absent. Keys
  // outside the schema are problems, or DeepSpeed keys judged by config_deepspeed.cc.
  static Section Open(const json* value, std::string path, const KeyNode* node, Problems* problems) {
    if (value == nullptr) return Section(nullptr, std::move(path), node, problems);
    if (!value->is_object()) {
      problems->Add(path.empty() ? absl::InvalidArgumentError(
                                       absl::StrCat("config must be a JSON object, got ", value->type_name()))
                                 : TypeError(path, "an object", *value));
      return Section(nullptr, std::move(path), node, problems);
    }
    for (const auto& item : value->items()) {
      const bool known = std::any_of(node->children.begin(), node->children.end(),
                                     [&](const KeyNode& c) { return item.key() == c.name; });
      if (!known) Unknown(path, item.key(), item.value(), *node, problems);
    }
    return Section(value, std::move(path), node, problems);
  }

  bool present() const { return obj_ != nullptr; }
  bool Has(const std::string& key) const { return Find(key) != nullptr; }
  std::string Path(absl::string_view key) const { return JoinPath(path_, key); }
  const json* Find(const std::string& key) const {
    if (obj_ == nullptr) return nullptr;
    auto it = obj_->find(key);
    return it == obj_->end() ? nullptr : &*it;
  }
  // The first key present in this section, or "" (for "does not apply" errors).
  std::string FirstKey() const { return obj_ == nullptr || obj_->empty() ? "" : obj_->begin().key(); }

  absl::StatusOr<Section> Sub(const std::string& key) const {
    for (const KeyNode& child : node_->children) {
      if (key == child.name) return Open(Find(key), Path(key), &child, problems_);
    }
    return absl::InternalError(absl::StrCat("config schema has no key '", Path(key), "'"));
  }

  // The getters below record a bad value as a problem and leave their output unchanged.
  template <typename T>
  absl::Status Int(const std::string& key, Range range, T* out) const {
    return Report(key, IntOrError(key, range, out));
  }
  absl::Status Double(const std::string& key, Range range, double* out) const {
    return Report(key, DoubleOrError(key, range, out));
  }
  absl::Status Bool(const std::string& key, bool* out) const { return Report(key, BoolOrError(key, out)); }
  absl::Status String(const std::string& key, std::string* out) const {
    return Report(key, StringOrError(key, out));
  }
  absl::Status Uint64(const std::string& key, uint64_t* out) const { return Report(key, Uint64OrError(key, out)); }
  absl::Status Bytes(const std::string& key, uint64_t* out) const { return Report(key, BytesOrError(key, out)); }
  // Whether the key (or, with "auto" unresolved, its value) was already reported as a problem.
  bool Failed(const std::string& key) const { return problems_->Failed(Path(key)); }

 private:
  Section(const json* obj, std::string path, const KeyNode* node, Problems* problems)
      : obj_(obj), path_(std::move(path)), node_(node), problems_(problems) {}

  static void Unknown(const std::string& prefix, const std::string& key, const json& v, const KeyNode& node,
                      Problems* problems) {
    const std::string path = JoinPath(prefix, key);
    const deepspeed::KeyInfo* ds = deepspeed::FindKey(path);
    if (ds == nullptr && v.is_object() && deepspeed::HasKeysUnder(path)) {  // a DeepSpeed block: key by key
      for (const auto& item : v.items()) Unknown(path, item.key(), item.value(), KeyNode{""}, problems);
      return;
    }
    if (ds == nullptr) return problems->Add(UnknownKeyError(prefix, key, node));
    std::string problem;
    bool no_effect = false;
    deepspeed::Judge(*ds, path, v, &problem, &no_effect);
    if (no_effect) return problems->NoEffect(path);
    problems->Add(std::move(problem));
  }

  absl::Status Report(const std::string& key, absl::Status s) const {
    problems_->Add(Path(key), s);
    return absl::OkStatus();
  }

  template <typename T>
  absl::Status IntOrError(const std::string& key, Range range, T* out) const {
    const json* v = Find(key);
    if (v == nullptr) return absl::OkStatus();
    STRATA_ASSIGN_OR_RETURN(const int64_t x, AsInt64(*v, Path(key)));
    if (!range.Contains(static_cast<double>(x))) return RangeError(Path(key), *v, range.ToString());
    if (x > std::numeric_limits<T>::max()) {
      return RangeError(Path(key), *v, absl::StrCat("<= ", std::numeric_limits<T>::max()));
    }
    *out = static_cast<T>(x);
    return absl::OkStatus();
  }

  absl::Status DoubleOrError(const std::string& key, Range range, double* out) const {
    const json* v = Find(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_number()) return TypeError(Path(key), "a number", *v);
    if (!range.Contains(v->get<double>())) return RangeError(Path(key), *v, range.ToString());
    *out = v->get<double>();
    return absl::OkStatus();
  }

  absl::Status BoolOrError(const std::string& key, bool* out) const {
    const json* v = Find(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_boolean()) return TypeError(Path(key), "a boolean", *v);
    *out = v->get<bool>();
    return absl::OkStatus();
  }

  absl::Status StringOrError(const std::string& key, std::string* out) const {
    const json* v = Find(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_string()) return TypeError(Path(key), "a string", *v);
    *out = v->get<std::string>();
    return absl::OkStatus();
  }

  absl::Status Uint64OrError(const std::string& key, uint64_t* out) const {
    const json* v = Find(key);
    if (v == nullptr) return absl::OkStatus();
    STRATA_ASSIGN_OR_RETURN(*out, AsUint64(*v, Path(key)));
    return absl::OkStatus();
  }

  // A byte budget: a non-negative integer or a size string ("512MiB"); must be >= 1.
  absl::Status BytesOrError(const std::string& key, uint64_t* out) const {
    const json* v = Find(key);
    if (v == nullptr) return absl::OkStatus();
    uint64_t bytes = 0;
    if (v->is_string()) {
      auto parsed = ParseBytes(v->get<std::string>());
      if (!parsed.ok()) return Annotate(parsed.status(), absl::StrCat("config key '", Path(key), "'"));
      bytes = *parsed;
    } else if (v->is_number()) {
      STRATA_RETURN_IF_ERROR(Uint64OrError(key, &bytes));
    } else {
      return TypeError(Path(key), "a byte count or a size string like \"512MiB\"", *v);
    }
    if (bytes == 0) return RangeError(Path(key), *v, ">= 1 byte");
    *out = bytes;
    return absl::OkStatus();
  }

  const json* obj_;
  std::string path_;
  const KeyNode* node_;
  Problems* problems_;
};

// Error unless `key` is absent: it does not apply in the current context (`why`).
absl::Status RejectKey(const Section& s, const std::string& key, absl::string_view why) {
  if (!s.Has(key)) return absl::OkStatus();
  return KeyError(s.Path(key), why);
}

// ---------------------------------------------------------------------------------------------------
// Sections.

// What the precision blocks said, resolved into param_dtype by ResolvePrecision.
struct PrecisionRequest {
  bool bf16_given = false;
  bool bf16_enabled = false;
  bool fp16_given = false;
  bool strata_dtype_given = false;
  DType strata_dtype = DType::kF32;
};

absl::Status ParseTopLevel(const Section& root, EngineConfig* cfg) {
  STRATA_RETURN_IF_ERROR(
      root.Int("train_micro_batch_size_per_gpu", AtLeast(1), &cfg->train_micro_batch_size_per_gpu));
  STRATA_RETURN_IF_ERROR(
      root.Int("gradient_accumulation_steps", AtLeast(1), &cfg->gradient_accumulation_steps));
  STRATA_RETURN_IF_ERROR(root.Double("gradient_clipping", AtLeast(0), &cfg->gradient_clipping));
  cfg->micro_batch_given = root.Has("train_micro_batch_size_per_gpu");
  cfg->accumulation_given = root.Has("gradient_accumulation_steps");
  return root.Int("train_batch_size", AtLeast(1), &cfg->train_batch_size);  // Note [The batch triangle]
}

absl::Status ParseHalfPrecision(const Section& root, EngineConfig* cfg, PrecisionRequest* req) {
  STRATA_ASSIGN_OR_RETURN(const Section bf16, root.Sub("bf16"));
  req->bf16_given = bf16.Has("enabled");
  STRATA_RETURN_IF_ERROR(bf16.Bool("enabled", &req->bf16_enabled));
  STRATA_ASSIGN_OR_RETURN(const Section fp16, root.Sub("fp16"));
  req->fp16_given = fp16.Has("enabled");
  Fp16Config& f = cfg->fp16;
  STRATA_RETURN_IF_ERROR(fp16.Bool("enabled", &f.enabled));
  STRATA_RETURN_IF_ERROR(fp16.Double("loss_scale", AtLeast(0), &f.static_loss_scale));
  STRATA_RETURN_IF_ERROR(fp16.Double("initial_scale_power", Closed(0, 127), &f.initial_scale_power));
  STRATA_RETURN_IF_ERROR(fp16.Int("loss_scale_window", AtLeast(1), &f.loss_scale_window));
  STRATA_RETURN_IF_ERROR(fp16.Int("hysteresis", AtLeast(1), &f.hysteresis));
  STRATA_RETURN_IF_ERROR(fp16.Bool("consecutive_hysteresis", &f.consecutive_hysteresis));
  return fp16.Double("min_loss_scale", Above(0), &f.min_loss_scale);
}

absl::Status ParseBetas(const Section& params, OptimizerConfig* opt) {
  const json* v = params.Find("betas");
  if (v == nullptr) return absl::OkStatus();
  const std::string path = params.Path("betas");
  if (!v->is_array() || v->size() != 2 || !(*v)[0].is_number() || !(*v)[1].is_number()) {
    return TypeError(path, "an array of 2 numbers", *v);
  }
  double* outs[2] = {&opt->beta1, &opt->beta2};
  for (size_t i = 0; i < 2; ++i) {
    const double beta = (*v)[i].get<double>();
    if (!HalfOpen(0, 1).Contains(beta)) {
      return RangeError(absl::StrCat(path, "[", i, "]"), (*v)[i], HalfOpen(0, 1).ToString());
    }
    *outs[i] = beta;
  }
  return absl::OkStatus();
}

absl::Status ParseOptimizer(const Section& root, OptimizerConfig* opt) {
  STRATA_ASSIGN_OR_RETURN(const Section s, root.Sub("optimizer"));
  std::string type = "AdamW";
  STRATA_RETURN_IF_ERROR(s.String("type", &type));
  const std::string lower = absl::AsciiStrToLower(type);
  if (lower == "adamw" || lower == "adam") {
    opt->type = OptimizerType::kAdamW;
  } else if (lower == "sgd") {
    opt->type = OptimizerType::kSgd;
  } else {
    return KeyError(s.Path("type"), absl::StrCat("is '", type, "'; supported types: AdamW, Adam, SGD"));
  }
  STRATA_ASSIGN_OR_RETURN(const Section p, s.Sub("params"));
  const std::string why = absl::StrCat("does not apply to optimizer type '", type, "'");
  if (opt->type == OptimizerType::kSgd) {
    for (const char* key : {"betas", "eps", "adam_w_mode", "torch_adam"}) {
      STRATA_RETURN_IF_ERROR(RejectKey(p, key, why + " (Adam/AdamW only)"));
    }
  } else {
    STRATA_RETURN_IF_ERROR(RejectKey(p, "momentum", why + " (SGD only)"));
  }
  STRATA_RETURN_IF_ERROR(p.Double("lr", Above(0), &opt->lr));
  STRATA_RETURN_IF_ERROR(p.Double("eps", Above(0), &opt->eps));
  STRATA_RETURN_IF_ERROR(p.Double("weight_decay", AtLeast(0), &opt->weight_decay));
  STRATA_RETURN_IF_ERROR(p.Double("momentum", HalfOpen(0, 1), &opt->momentum));
  // DeepSpeed: "AdamW" is always decoupled; "Adam" follows adam_w_mode (default true). torch_adam picks
  // torch's implementation of the same rule, so it changes nothing here.
  bool adam_w_mode = true, torch_adam = false;
  STRATA_RETURN_IF_ERROR(p.Bool("adam_w_mode", &adam_w_mode));
  STRATA_RETURN_IF_ERROR(p.Bool("torch_adam", &torch_adam));
  opt->adam_w_mode = lower == "adamw" || adam_w_mode;
  return ParseBetas(p, opt);
}

// Note [DeepSpeed's schedules] (optimizer.cc) has the formulas. DeepSpeed's constructors take exactly these
// parameters: WarmupLR (warmup_min_lr 0, warmup_max_lr the optimizer's lr, warmup_num_steps 1000, warmup_type
// "log"), WarmupDecayLR (the same, but warmup_max_lr 0.001, plus total_num_steps), WarmupCosineLR
// (total_num_steps, warmup_min_ratio 0, warmup_num_steps 1000, cos_min_ratio 1e-4, warmup_type "log"; its
// peak is the optimizer's lr). warmup_num_steps must be >= 1 (DeepSpeed raises otherwise). The peak of
// WarmupLR / WarmupDecayLR is kept as optimizer.lr, which the scheduler replaces in DeepSpeed too.
absl::Status ParseWarmupParams(const Section& p, bool cosine, EngineConfig* cfg) {
  SchedulerConfig& sc = cfg->scheduler;
  sc.warmup_steps = 1000;
  STRATA_RETURN_IF_ERROR(p.Int("warmup_num_steps", AtLeast(1), &sc.warmup_steps));
  std::string warmup_type = "log";
  STRATA_RETURN_IF_ERROR(p.String("warmup_type", &warmup_type));
  if (warmup_type != "log" && warmup_type != "linear") {
    return KeyError(p.Path("warmup_type"), absl::StrCat("is '", warmup_type, "'; use 'log' (the default) or 'linear'"));
  }
  sc.log_warmup = warmup_type == "log";
  if (cosine) {
    const std::string why = " does not apply to WarmupCosineLR, whose peak is optimizer.params.lr";
    STRATA_RETURN_IF_ERROR(RejectKey(p, "warmup_max_lr", why));
    STRATA_RETURN_IF_ERROR(RejectKey(p, "warmup_min_lr", absl::StrCat(why, "; use warmup_min_ratio")));
    return p.Double("warmup_min_ratio", Closed(0, 1), &sc.warmup_min_ratio);
  }
  STRATA_RETURN_IF_ERROR(RejectKey(p, "warmup_min_ratio", "applies to WarmupCosineLR only; use warmup_min_lr"));
  STRATA_RETURN_IF_ERROR(p.Double("warmup_max_lr", Above(0), &cfg->optimizer.lr));
  STRATA_RETURN_IF_ERROR(p.Double("warmup_min_lr", AtLeast(0), &sc.warmup_min_lr));
  if (sc.warmup_min_lr > cfg->optimizer.lr && !p.Failed("warmup_max_lr")) {
    return KeyError(p.Path("warmup_min_lr"),
                    absl::StrCat("is ", sc.warmup_min_lr, ", above the peak lr ", cfg->optimizer.lr));
  }
  return absl::OkStatus();
}

// total_num_steps: required for the decaying schedules, and past the warm-up.
absl::Status ParseDecayHorizon(const Section& p, absl::string_view type, SchedulerConfig* sc) {
  const std::string path = p.Path("total_num_steps");
  if (!p.Has("total_num_steps") && !p.Failed("total_num_steps")) {
    return KeyError(path, absl::StrCat("is required for scheduler type '", type, "'"));
  }
  STRATA_RETURN_IF_ERROR(p.Int("total_num_steps", AtLeast(1), &sc->total_steps));
  if (p.Failed("total_num_steps") || p.Failed("warmup_num_steps")) return absl::OkStatus();
  if (sc->total_steps <= sc->warmup_steps) {
    return KeyError(path, absl::StrCat("is ", sc->total_steps, ", but must be > warmup_num_steps (",
                                       sc->warmup_steps, ")"));
  }
  return absl::OkStatus();
}

absl::Status ParseScheduler(const Section& root, EngineConfig* cfg) {
  STRATA_ASSIGN_OR_RETURN(const Section s, root.Sub("scheduler"));
  std::string type = "constant";
  STRATA_RETURN_IF_ERROR(s.String("type", &type));
  STRATA_ASSIGN_OR_RETURN(const Section p, s.Sub("params"));
  const std::string lower = absl::AsciiStrToLower(type);
  const std::string why = absl::StrCat("does not apply to scheduler type '", type, "'");
  SchedulerConfig& sc = cfg->scheduler;
  if (lower == "constant") {
    sc = SchedulerConfig{};
    return p.FirstKey().empty() ? absl::OkStatus() : KeyError(p.Path(p.FirstKey()), why);
  }
  if (lower != "warmuplr" && lower != "warmupdecaylr" && lower != "warmupcosinelr") {
    return KeyError(s.Path("type"), absl::StrCat("is '", type,
                                                 "'; supported types: WarmupLR, WarmupDecayLR, "
                                                 "WarmupCosineLR, constant (DeepSpeed's OneCycle and "
                                                 "LRRangeTest are schedules Strata does not have)"));
  }
  const bool cosine = lower == "warmupcosinelr";
  if (lower == "warmupdecaylr") cfg->optimizer.lr = 0.001;  // DeepSpeed's warmup_max_lr default here
  STRATA_RETURN_IF_ERROR(ParseWarmupParams(p, cosine, cfg));
  // Note [Param groups]: WarmupLR's warmup_max_lr defaults to each param group's own lr; a number given, or
  // WarmupDecayLR's default 0.001, is every group's peak (DeepSpeed's _format_param).
  sc.shared_peak = lower == "warmupdecaylr" || (lower == "warmuplr" && p.Has("warmup_max_lr"));
  if (!cosine) STRATA_RETURN_IF_ERROR(RejectKey(p, "cos_min_ratio", why));
  sc.min_lr = sc.warmup_min_lr;
  sc.type = cosine ? LrScheduleType::kWarmupCosineLR
                   : lower == "warmuplr" ? LrScheduleType::kWarmupLR : LrScheduleType::kWarmupDecayLR;
  if (lower == "warmuplr") return RejectKey(p, "total_num_steps", why + " (warm-up, then constant)");
  STRATA_RETURN_IF_ERROR(ParseDecayHorizon(p, type, &sc));
  if (!cosine) return absl::OkStatus();
  STRATA_RETURN_IF_ERROR(p.Double("cos_min_ratio", Closed(0, 1), &sc.cos_min_ratio));
  sc.min_lr = sc.cos_min_ratio * cfg->optimizer.lr;
  return absl::OkStatus();
}

absl::Status ParseOffload(const Section& zero, const std::string& key, OffloadConfig* out) {
  STRATA_ASSIGN_OR_RETURN(const Section s, zero.Sub(key));
  std::string device = "none";
  STRATA_RETURN_IF_ERROR(s.String("device", &device));
  const std::string lower = absl::AsciiStrToLower(device);
  if (lower == "none") {
    out->device = OffloadDevice::kNone;
  } else if (lower == "cpu") {
    out->device = OffloadDevice::kCpu;
  } else if (lower == "nvme") {
    out->device = OffloadDevice::kNvme;
  } else {
    return KeyError(s.Path("device"), absl::StrCat("is '", device, "'; use 'none', 'cpu' or 'nvme'"));
  }
  STRATA_RETURN_IF_ERROR(s.String("nvme_path", &out->nvme_path));
  STRATA_RETURN_IF_ERROR(s.Bool("pin_memory", &out->pin_memory));
  STRATA_RETURN_IF_ERROR(s.Int("buffer_count", AtLeast(1), &out->buffer_count));
  if (out->device == OffloadDevice::kNvme && out->nvme_path.empty()) {
    return KeyError(s.Path("nvme_path"), "must be a non-empty path when device is 'nvme'");
  }
  return absl::OkStatus();
}

// An integer >= 1 or "node"; whether it divides the world is checked at Create, which knows the world.
absl::Status ParseShardGroupSize(const Section& z, EngineConfig* cfg) {
  const json* v = z.Find("shard_group_size");
  if (v == nullptr) return absl::OkStatus();
  if (v->is_string()) {
    if (v->get<std::string>() != "node")
      return TypeError(z.Path("shard_group_size"), "an integer >= 1 or \"node\"", *v);
    cfg->shard_group_size = kShardGroupNode;
  } else {
    STRATA_RETURN_IF_ERROR(z.Int("shard_group_size", AtLeast(1), &cfg->shard_group_size));
  }
  if (cfg->stage == 0) {
    return KeyError(z.Path("shard_group_size"), "needs stage 1, 2 or 3 (stage 0 shards nothing)");
  }
  return absl::OkStatus();
}

absl::Status ParseZero(const Section& root, EngineConfig* cfg) {
  STRATA_ASSIGN_OR_RETURN(const Section z, root.Sub("zero_optimization"));
  STRATA_RETURN_IF_ERROR(z.Int("stage", Closed(0, 3), &cfg->stage));
  if (z.Failed("stage")) return absl::OkStatus();  // the offload and shard-group checks need a stage
  STRATA_RETURN_IF_ERROR(ParseOffload(z, "offload_param", &cfg->offload_param));
  STRATA_RETURN_IF_ERROR(ParseOffload(z, "offload_optimizer", &cfg->offload_optimizer));
  if (cfg->offload_param.device != OffloadDevice::kNone && cfg->stage != 3) {
    return KeyError(z.Path("offload_param"), absl::StrCat("needs stage 3 (stage is ", cfg->stage, ")"));
  }
  if (cfg->offload_optimizer.device != OffloadDevice::kNone && cfg->stage == 0) {
    return KeyError(z.Path("offload_optimizer"), "needs stage 1, 2 or 3 (stage is 0)");
  }
  return ParseShardGroupSize(z, cfg);
}

absl::Status ParseDTypeKey(const Section& s, const std::string& key, bool* given, DType* out) {
  std::string name;
  STRATA_RETURN_IF_ERROR(s.String(key, &name));
  if (!s.Has(key) || !s.Find(key)->is_string()) return absl::OkStatus();  // a wrong type is reported already
  auto dtype = ParseDType(absl::AsciiStrToLower(name));
  if (!dtype.ok()) return Annotate(dtype.status(), absl::StrCat("config key '", s.Path(key), "'"));
  *given = true;
  *out = *dtype;
  return absl::OkStatus();
}

absl::Status ParseStrata(const Section& root, EngineConfig* cfg, PrecisionRequest* req) {
  STRATA_ASSIGN_OR_RETURN(const Section s, root.Sub("strata"));
  STRATA_RETURN_IF_ERROR(ParseDTypeKey(s, "param_dtype", &req->strata_dtype_given, &req->strata_dtype));
  bool reduce_given = false;
  STRATA_RETURN_IF_ERROR(ParseDTypeKey(s, "reduce_dtype", &reduce_given, &cfg->reduce_dtype));
  if (cfg->reduce_dtype == DType::kF16) {
    return RangeError(s.Path("reduce_dtype"), *s.Find("reduce_dtype"), "\"fp32\" or \"bf16\"");
  }
  STRATA_RETURN_IF_ERROR(s.Int("max_live_units", AtLeast(1), &cfg->max_live_units));
  STRATA_RETURN_IF_ERROR(s.Int("prefetch_depth", AtLeast(0), &cfg->prefetch_depth));
  STRATA_RETURN_IF_ERROR(s.Bool("reshard_after_forward", &cfg->reshard_after_forward));
  STRATA_RETURN_IF_ERROR(s.Int("collective_timeout_ms", AtLeast(1), &cfg->collective_timeout_ms));
  if (cfg->collective_timeout_ms > kMaxTimeoutMs) {
    return RangeError(s.Path("collective_timeout_ms"), *s.Find("collective_timeout_ms"), "<= 1e12 (about 31 years)");
  }
  STRATA_RETURN_IF_ERROR(s.Uint64("seed", &cfg->seed));
  STRATA_RETURN_IF_ERROR(s.Bytes("device_budget", &cfg->device_budget_bytes));
  STRATA_RETURN_IF_ERROR(s.Int("optimizer_threads", Closed(0, kernels::cpu::ThreadPool::kMaxThreads),
                               &cfg->optimizer_threads));
  STRATA_RETURN_IF_ERROR(s.Bool("optimizer_in_backward", &cfg->optimizer_in_backward));
  STRATA_RETURN_IF_ERROR(s.Bool("release_idle_memory", &cfg->release_idle_memory));
  std::string no_grad;
  STRATA_RETURN_IF_ERROR(s.String("params_without_grad", &no_grad));
  if (s.Has("params_without_grad")) {
    if (no_grad != "zero" && no_grad != "skip") {
      return RangeError(s.Path("params_without_grad"), *s.Find("params_without_grad"),
                        "\"zero\" (DeepSpeed's: updated with a zero gradient) or \"skip\" (torch's: not updated)");
    }
    cfg->skip_params_without_grad = no_grad == "skip";
  }
  STRATA_RETURN_IF_ERROR(s.Bool("weight_decay_1d", &cfg->weight_decay_1d));
  return s.Bytes("host_budget", &cfg->host_budget_bytes);
}

// See the file comment: the bf16 / fp16 blocks and strata.param_dtype must agree.
absl::Status ResolvePrecision(const PrecisionRequest& req, EngineConfig* cfg) {
  if (req.bf16_enabled && cfg->fp16.enabled) {
    return absl::InvalidArgumentError(
        "config keys 'bf16.enabled' and 'fp16.enabled' are both true; enable at most one");
  }
  cfg->bf16 = req.bf16_enabled;
  if (req.bf16_enabled) cfg->param_dtype = DType::kBF16;
  if (cfg->fp16.enabled) cfg->param_dtype = DType::kF16;
  if (!req.strata_dtype_given) return absl::OkStatus();
  const std::string name(DTypeName(req.strata_dtype));
  const bool block_on = req.bf16_enabled || cfg->fp16.enabled;
  const bool bf16_says_no = req.bf16_given && !req.bf16_enabled && req.strata_dtype == DType::kBF16;
  if ((block_on && req.strata_dtype != cfg->param_dtype) || bf16_says_no) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config key 'strata.param_dtype' is \"", name, "\", which disagrees with bf16.enabled=",
        req.bf16_enabled ? "true" : "false", " / fp16.enabled=", cfg->fp16.enabled ? "true" : "false"));
  }
  if (req.strata_dtype == DType::kF16 && !cfg->fp16.enabled) {
    return KeyError("strata.param_dtype", "is \"fp16\", which needs fp16.enabled=true (loss scaling)");
  }
  cfg->param_dtype = req.strata_dtype;
  cfg->bf16 = req.strata_dtype == DType::kBF16;
  return absl::OkStatus();
}

// Note [One pass, every problem]: each section is parsed even after another failed.
absl::StatusOr<EngineConfig> Validate(json doc, const ConfigFacts& facts) {
  EngineConfig cfg = JsonDefaults();
  Problems problems;
  std::vector<std::pair<std::string, std::string>> auto_problems;
  std::vector<std::string> resolved;
  if (doc.is_object()) deepspeed::ResolveAuto(facts, &doc, &auto_problems, &resolved);
  for (const auto& [path, message] : auto_problems) problems.Add(path, absl::InvalidArgumentError(message));
  PrecisionRequest req;
  const Section root = Section::Open(&doc, "", &Schema(), &problems);
  problems.Add(ParseTopLevel(root, &cfg));
  problems.Add(ParseHalfPrecision(root, &cfg, &req));
  problems.Add(ParseOptimizer(root, &cfg.optimizer));
  problems.Add(ParseScheduler(root, &cfg));  // after the optimizer: may override its lr
  problems.Add(ParseZero(root, &cfg));
  problems.Add(ParseStrata(root, &cfg, &req));
  problems.Add(ResolvePrecision(req, &cfg));
  problems.Add(CheckOptimizerInBackward(cfg));
  if (!problems.empty()) return problems.Error();
  cfg.auto_resolved = std::move(resolved);
  if (!problems.no_effect().empty()) {
    cfg.notes.push_back(absl::StrCat("config: DeepSpeed keys with no effect in Strata (it gathers and reduces per "
                                     "unit on its own streams, and logs its own metrics): ",
                                     absl::StrJoin(problems.no_effect(), ", ")));
  }
  if (facts.world_size > 0) STRATA_RETURN_IF_ERROR(ResolveBatchSizes(facts.world_size, &cfg));
  return cfg;
}

absl::StatusOr<EngineConfig> ValidateNoThrow(const json& doc, const ConfigFacts& facts) {
  try {
    return Validate(doc, facts);
  } catch (const json::exception& e) {  // type checks precede every access; this is a bug guard
    return absl::InternalError(absl::StrCat("config validation failed unexpectedly: ", e.what()));
  }
}

// ---------------------------------------------------------------------------------------------------
// JSON text and overrides.

absl::StatusOr<json> ParseJsonText(absl::string_view text) {
  return ParseGuardedJson(std::string_view(text.data(), text.size()), "config");  // Note: json_text.h
}

}  // namespace

EngineConfig JsonDefaults() {
  EngineConfig cfg;
  cfg.stage = 0;               // DeepSpeed's ZeroStageEnum default
  cfg.weight_decay_1d = true;  // DeepSpeed decays every parameter of the group
  return cfg;
}

absl::StatusOr<EngineConfig> ParseConfig(std::string_view json_text) {
  STRATA_ASSIGN_OR_RETURN(const json doc, ParseJsonText(ToAbsl(json_text)));
  return ValidateNoThrow(doc, ConfigFacts{});
}

absl::StatusOr<EngineConfig> LoadConfigFile(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(const std::string text, ReadConfigFile(path));
  auto cfg = ParseConfig(text);
  if (!cfg.ok()) return Annotate(cfg.status(), path);
  return cfg;
}

absl::StatusOr<EngineConfig> ParseConfigWithOverrides(std::string_view json_text,
                                                      const std::vector<std::string>& overrides,
                                                      const ConfigFacts& facts) {
  const absl::string_view text = ToAbsl(json_text);
  const bool empty = absl::StripAsciiWhitespace(text).empty();
  STRATA_ASSIGN_OR_RETURN(json doc, empty ? absl::StatusOr<json>(json::object()) : ParseJsonText(text));
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("config must be a JSON object, got ", doc.type_name()));
  }
  for (const std::string& override_text : overrides) {
    STRATA_RETURN_IF_ERROR(ApplyConfigOverride(override_text, &doc));
  }
  return ValidateNoThrow(doc, facts);
}

const std::vector<std::string>& ValidKeyPaths() {
  static const std::vector<std::string>* const kPaths = [] {
    auto* paths = new std::vector<std::string>();
    CollectPaths(Schema(), "", paths);
    return paths;
  }();
  return *kPaths;
}

}  // namespace strata::engine
