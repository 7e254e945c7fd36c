#include "runtime/comm/agree.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_split.h"
#include "runtime/base/status.h"

namespace strata::comm {

namespace {
constexpr char kAgreedFailure[] = "strata.comm/agreed_failure";
}  // namespace

absl::StatusOr<std::vector<std::string>> AllGatherText(Communicator& comm, const std::string& mine,
                                                       device::Stream& stream) {
  const int n = comm.size();
  if (n == 1) return std::vector<std::string>{mine};
  std::string text = mine;
  if (text.size() % 2 != 0) text.push_back('\0');  // the byte collectives move 16-bit elements
  const uint64_t len = mine.size();
  std::vector<uint64_t> lens(n);
  STRATA_RETURN_IF_ERROR(AllGatherBytes(comm, &len, lens.data(), sizeof(len), stream).Wait());
  uint64_t width = *std::max_element(lens.begin(), lens.end());
  if (width > (uint64_t{1} << 20)) return absl::InternalError("a rank's text to agree on is over 1 MiB");
  width += width % 2;
  text.resize(width, '\0');
  std::string all(width * n, '\0');
  STRATA_RETURN_IF_ERROR(AllGatherBytes(comm, text.data(), all.data(), width, stream).Wait());
  std::vector<std::string> out(n);
  for (int r = 0; r < n; ++r) out[r] = all.substr(r * width, lens[r]);
  return out;
}

absl::Status AgreeOnFields(const std::vector<std::pair<std::string, std::string>>& fields, absl::string_view what,
                           absl::string_view remedy, Communicator& comm, device::Stream& stream) {
  const int n = comm.size();
  if (n == 1) return absl::OkStatus();
  std::string text;
  for (const auto& [key, value] : fields) absl::StrAppend(&text, key, "=", value, "\n");
  STRATA_ASSIGN_OR_RETURN(std::vector<std::string> texts, AllGatherText(comm, text, stream));
  std::vector<std::vector<std::string>> lines(n);
  for (int r = 0; r < n; ++r) lines[r] = absl::StrSplit(texts[r], '\n', absl::SkipEmpty());
  for (size_t i = 0; i < lines[0].size(); ++i) {
    std::vector<std::string> line_i(n);  // setting i of every rank
    for (int r = 0; r < n; ++r) {
      if (i >= lines[r].size()) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, " differs across ranks: rank ", r, " has fewer settings than rank 0 (different Strata versions?); "
            "every rank must run the same build with the same configuration"));
      }
      line_i[r] = lines[r][i];
    }
    const auto values = RanksByValue(line_i);
    if (values.size() == 1) continue;
    const std::string key = lines[0][i].substr(0, lines[0][i].find('='));
    std::vector<std::string> parts;
    for (const auto& [line, ranks] : values) {
      parts.push_back(absl::StrCat(line.substr(line.find('=') + 1), " on ", RanksText(ranks)));
    }
    absl::Status out = absl::FailedPreconditionError(
        absl::StrCat(what, " differs across ranks: ", key, " is ", absl::StrJoin(parts, " but "), ". ", remedy));
    out.SetPayload(kAgreedFailure, absl::Cord("1"));  // every rank returns it alike
    return out;
  }
  return absl::OkStatus();
}

// Note [Agreed outcomes]. A phase that each rank runs on its own (its output files, its data) can fail on
// some ranks only; those ranks would stop while the others went on into the next collective and waited
// there for the collective timeout, printing only "rank 1 did not respond". So the phase ends with its
// outcome gathered: every rank stops at once, alike, and every rank's error names the failing ranks and
// their causes.
absl::Status AgreeOnOutcome(const absl::Status& mine, absl::string_view phase, Communicator& comm,
                            device::Stream& stream) {
  std::string text;
  if (!mine.ok()) text = mine.message().empty() ? absl::StatusCodeToString(mine.code()) : std::string(mine.message());
  STRATA_ASSIGN_OR_RETURN(std::vector<std::string> all, AllGatherText(comm, text, stream));
  std::vector<std::string> others;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    // A rank that failed as this one did adds nothing to this one's message.
    if (!all[r].empty() && r != comm.rank() && (mine.ok() || all[r] != text)) {
      others.push_back(absl::StrCat("rank ", r, " failed: ", all[r]));
    }
  }
  if (mine.ok() && others.empty()) return absl::OkStatus();
  absl::Status out =
      !mine.ok() ? mine : absl::FailedPreconditionError(absl::StrCat(phase, ": ", absl::StrJoin(others, "; ")));
  if (!mine.ok() && !others.empty()) {
    out = absl::Status(mine.code(), absl::StrCat(mine.message(), " (also ", absl::StrJoin(others, "; "), ")"));
  }
  out.SetPayload(kAgreedFailure, absl::Cord("1"));
  return out;
}

bool IsAgreedFailure(const absl::Status& s) { return s.GetPayload(kAgreedFailure).has_value(); }

}  // namespace strata::comm
