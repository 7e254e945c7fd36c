#include "runtime/base/json_text.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata {
namespace {

using json = nlohmann::json;

// The installed Abseil's string_view is its own type, not std::string_view.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Records the first key repeated within one object. Each frame is one open container: its name in the
// path ("" for the root and array elements) and, for objects, the keys seen so far.
class DuplicateKeyFinder {
 public:
  bool operator()(int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        frames_.push_back({after_key_ ? last_key_ : std::string(), {}});
        after_key_ = false;
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!frames_.empty()) frames_.pop_back();
        break;
      case json::parse_event_t::key:
        last_key_ = parsed.get<std::string>();
        after_key_ = true;
        if (!frames_.empty() && !frames_.back().keys.insert(last_key_).second && duplicate_.empty()) {
          duplicate_ = Path(last_key_);
        }
        break;
      case json::parse_event_t::value:
        after_key_ = false;
        break;
    }
    return true;
  }
  const std::string& duplicate() const { return duplicate_; }

 private:
  struct Frame {
    std::string name;
    std::set<std::string> keys;
  };
  std::string Path(const std::string& key) const {
    std::vector<std::string> parts;
    for (const Frame& f : frames_) {
      if (!f.name.empty()) parts.push_back(f.name);
    }
    parts.push_back(key);
    return absl::StrJoin(parts, ".");
  }

  std::vector<Frame> frames_;
  std::string last_key_;
  bool after_key_ = false;
  std::string duplicate_;
};

}  // namespace

absl::Status CheckJsonNesting(std::string_view text, int max_depth, std::string_view what) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth) {
        return absl::InvalidArgumentError(absl::StrCat(Sv(what), " JSON nests deeper than ", max_depth,
                                                       " levels (at byte ", i, ")"));
      }
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;  // unbalanced text is the parser's to report
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<json> ParseGuardedJson(std::string_view text, std::string_view what, int max_depth) {
  if (absl::Status s = CheckJsonNesting(text, max_depth, what); !s.ok()) return s;
  DuplicateKeyFinder finder;
  json doc;
  try {
    doc = json::parse(text.begin(), text.end(), std::ref(finder));
  } catch (const json::exception& e) {
    std::string_view message = e.what();  // "[json.exception.parse_error.101] parse error at line 1, ..."
    const size_t bracket = message.find("] ");
    if (bracket != std::string_view::npos) message.remove_prefix(bracket + 2);
    return absl::InvalidArgumentError(absl::StrCat("malformed ", Sv(what), " JSON: ", Sv(message)));
  }
  if (!finder.duplicate().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("duplicate ", Sv(what), " key '", finder.duplicate(), "'"));
  }
  return doc;
}

}  // namespace strata
