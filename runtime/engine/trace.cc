#include "runtime/engine/trace.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "runtime/base/status.h"
#include "runtime/checkpoint/files.h"

namespace strata::engine {
namespace {

// Stable thread ids per stream, so every rank's tracks line up in the same order.
int StreamTid(const std::string& stream) {
  static const std::map<std::string, int> kTids = {{"compute", 1}, {"gather", 2}, {"reduce", 3}, {"step", 4},
                                                   {"data", 5},    {"io", 6},     {"memory", 7}, {"h2d", 8}};
  auto it = kTids.find(stream);
  return it == kTids.end() ? 9 : it->second;
}

// `text` as a JSON string literal: quotes, backslashes and control bytes escaped, invalid UTF-8 replaced
// (U+FFFD) rather than thrown on.
std::string Quote(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

TraceRecorder::TraceRecorder(int rank, std::vector<std::string> unit_names, size_t max_events)
    : rank_(rank), unit_names_(std::move(unit_names)), max_events_(max_events) {}

void TraceRecorder::Push(Event e) {
  if (events_.size() >= max_events_) {
    ++dropped_;
    return;
  }
  if (first_ns_ == 0 || e.start_ns < first_ns_) first_ns_ = e.start_ns;
  events_.push_back(std::move(e));
}

void TraceRecorder::Add(const device::Span& s) {
  const std::string unit =
      s.unit >= 0 && s.unit < static_cast<int>(unit_names_.size()) ? unit_names_[s.unit] : std::string();
  const std::string name = unit.empty() ? s.kind : absl::StrCat(s.kind, " ", unit);
  Push(Event{name, s.kind, s.stream, s.start_ns, s.end_ns, false,
             unit.empty() ? "{}" : absl::StrCat("{\"unit\":", Quote(unit), "}")});
}

void TraceRecorder::AddAll(const std::vector<device::Span>& spans) {
  for (const auto& s : spans) Add(s);
}

void TraceRecorder::Memory(int64_t ns, const MemoryStats& m) {
  for (int t = 0; t < memory::kNumTiers; ++t) {
    Push(Event{absl::StrCat("memory ", memory::TierName(static_cast<memory::Tier>(t))), "memory", "memory", ns, ns,
               true, absl::StrCat("{\"bytes\":", m.tier[t].current_bytes, "}")});
  }
}

std::string TraceRecorder::EventsJson(int64_t origin_ns) const {
  std::string out = absl::StrFormat(
      "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}}", rank_, rank_);
  for (const char* stream : {"compute", "gather", "reduce", "step", "data", "io", "h2d"}) {
    absl::StrAppendFormat(&out,
                          ",{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
                          rank_, StreamTid(stream), stream);
  }
  for (const Event& e : events_) {
    const double ts = 1e-3 * double(e.start_ns - origin_ns);
    if (e.counter) {
      absl::StrAppendFormat(&out, ",{\"ph\":\"C\",\"name\":%s,\"pid\":%d,\"ts\":%.3f,\"args\":%s}", Quote(e.name),
                            rank_, ts, e.args);
    } else {
      absl::StrAppendFormat(&out,
                            ",{\"ph\":\"X\",\"name\":%s,\"cat\":%s,\"pid\":%d,\"tid\":%d,\"ts\":%.3f,"
                            "\"dur\":%.3f,\"args\":%s}",
                            Quote(e.name), Quote(e.cat), rank_, StreamTid(e.stream), ts,
                            1e-3 * double(e.end_ns - e.start_ns), e.args);
    }
  }
  return out;
}

absl::Status WriteTrace(comm::Communicator& world, device::Stream& stream, const TraceRecorder* rec,
                        const std::string& path, absl::Status local) {
  if (local.ok() && rec == nullptr) local = absl::FailedPreconditionError("no trace is being recorded");
  if (local.ok() && world.rank() == 0) {  // before the exchange: a path that cannot be written fails every rank
    local = checkpoint::CheckReplaceable(path);
    const std::string tmp = checkpoint::TempName(path);  // the file is written through this temporary
    if (local.ok()) local = checkpoint::OpenForWrite(tmp).status();
    if (local.ok()) ::unlink(tmp.c_str());
    local = Annotate(local, absl::StrCat("cannot write trace '", path, "'"));
  }
  const int n = world.size();
  // The first exchange carries each rank's start time, or kCannot: a monotonic clock is never negative.
  constexpr int64_t kCannot = std::numeric_limits<int64_t>::min();
  std::vector<int64_t> firsts(n);
  int64_t mine = !local.ok() ? kCannot : (rec->first_ns() ? rec->first_ns() : std::numeric_limits<int64_t>::max());
  STRATA_RETURN_IF_ERROR(comm::AllGatherBytes(world, &mine, firsts.data(), 8, stream).Wait());
  std::vector<int> cannot;
  for (int r = 0; r < n; ++r) {
    if (firsts[r] == kCannot) cannot.push_back(r);
  }
  if (!local.ok()) return local;
  if (!cannot.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("writing the trace: rank(s) ", absl::StrJoin(cannot, ", "),
                                                      " could not take part (their own errors say why); nothing "
                                                      "was written"));
  }
  const int64_t origin = *std::min_element(firsts.begin(), firsts.end());
  std::string json = rec->EventsJson(origin);
  std::vector<uint64_t> lengths(n);
  uint64_t len = json.size();
  STRATA_RETURN_IF_ERROR(comm::AllGatherBytes(world, &len, lengths.data(), 8, stream).Wait());
  uint64_t max_len = *std::max_element(lengths.begin(), lengths.end());
  max_len += max_len % 2;
  json.resize(max_len, ' ');
  std::string all(max_len * n, ' ');
  STRATA_RETURN_IF_ERROR(comm::AllGatherBytes(world, json.data(), all.data(), max_len, stream).Wait());
  if (world.rank() != 0) return absl::OkStatus();
  // Written like a checkpoint file: a temporary, fsynced and renamed, so a full disk or a kill leaves no
  // partial trace, and the error names the cause (checkpoint::WriteFileAtomic).
  std::string text = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  for (int r = 0; r < n; ++r)
    absl::StrAppend(&text, r ? "," : "", absl::string_view(all).substr(r * max_len, lengths[r]));
  text += "]}\n";
  return Annotate(checkpoint::WriteFileAtomic(path, text), absl::StrCat("writing trace '", path, "'"));
}

}  // namespace strata::engine
