#include "runtime/checkpoint/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/common/element_math.h"
#include "runtime/base/json_text.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/files.h"

namespace strata::checkpoint {
namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit
constexpr size_t kMaxDims = 64;

uint64_t DTypeSize(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

absl::Status Corrupt(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrCat("safetensors file '", path, "': ", what));
}

// Every size below comes from the file: each product and sum is checked.
absl::StatusOr<uint64_t> ShapeBytes(const std::string& path, const std::string& name, const std::vector<int64_t>& shape,
                                    uint64_t dtype_bytes) {
  uint64_t bytes = dtype_bytes;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
      return Corrupt(path, absl::StrCat("tensor '", name, "' has shape [", absl::StrJoin(shape, ","),
                                        "], whose byte size overflows 64 bits"));
    }
  }
  return bytes;
}

absl::StatusOr<std::vector<int64_t>> ParseShape(const std::string& path, const std::string& name, const json& v) {
  if (!v.is_array()) return Corrupt(path, absl::StrCat("tensor '", name, "' shape is not an array"));
  if (v.size() > kMaxDims) {
    return Corrupt(path, absl::StrCat("tensor '", name, "' shape has ", v.size(), " dimensions, more than ", kMaxDims));
  }
  std::vector<int64_t> shape;
  for (const json& d : v) {
    // Unsigned only: floats (2.5) and negatives are refused, not truncated or wrapped.
    if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return Corrupt(path, absl::StrCat("tensor '", name, "' shape holds ", d.dump(),
                                        ", not a non-negative integer dimension"));
    }
    shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }
  return shape;
}

absl::StatusOr<TensorInfo> ParseEntry(const std::string& path, const std::string& name, const json& v,
                                      uint64_t data_bytes) {
  if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) {
    return Corrupt(path, absl::StrCat("tensor '", name, "' lacks dtype, shape or data_offsets"));
  }
  TensorInfo t;
  t.name = name;
  const json& dtype = v.at("dtype");
  if (!dtype.is_string()) return Corrupt(path, absl::StrCat("tensor '", name, "' dtype is not a string"));
  t.dtype = dtype.get<std::string>();
  const uint64_t size = DTypeSize(t.dtype);
  if (size == 0) return Corrupt(path, absl::StrCat("tensor '", name, "' has unknown dtype '", t.dtype, "'"));
  STRATA_ASSIGN_OR_RETURN(t.shape, ParseShape(path, name, v.at("shape")));
  const json& off = v.at("data_offsets");
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
    return Corrupt(path, absl::StrCat("tensor '", name, "' data_offsets must be two non-negative integers"));
  }
  t.begin = off[0].get<uint64_t>();
  t.end = off[1].get<uint64_t>();
  STRATA_ASSIGN_OR_RETURN(const uint64_t need, ShapeBytes(path, name, t.shape, size));
  if (t.end < t.begin || t.end - t.begin != need) {
    return Corrupt(path, absl::StrCat("tensor '", name, "' has data_offsets [", t.begin, ", ", t.end,
                                      "] but its shape and ", t.dtype, " need ", need, " bytes"));
  }
  if (t.end > data_bytes) {
    return Corrupt(path, absl::StrCat("tensor '", name, "': data_offsets [", t.begin, ", ", t.end,
                                      "] do not hold its bytes within the ", data_bytes,
                                      " data bytes of the file (truncated file?)"));
  }
  return t;
}

// The format's rule: the tensors tile the data section, without overlaps, gaps or trailing bytes (a reader of
// byte ranges must never read bytes no tensor owns; docs/decisions/0037).
absl::Status CheckTiling(const std::string& path, const std::vector<TensorInfo>& tensors, uint64_t data_bytes) {
  std::vector<const TensorInfo*> sorted;
  for (const auto& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](auto* a, auto* b) { return a->begin != b->begin ? a->begin < b->begin : a->end < b->end; });
  uint64_t at = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (i > 0 && sorted[i]->begin < sorted[i - 1]->end) {
      return Corrupt(path, absl::StrCat("tensors '", sorted[i - 1]->name, "' and '", sorted[i]->name, "' overlap"));
    }
    if (sorted[i]->begin != at) {
      return Corrupt(path, absl::StrCat("tensor '", sorted[i]->name, "' starts at data byte ", sorted[i]->begin,
                                        ", expected ", at, " (the tensors must tile the data without gaps)"));
    }
    at = sorted[i]->end;
  }
  if (at != data_bytes) {
    return Corrupt(path, absl::StrCat("the tensors hold ", at, " data bytes and the file has ", data_bytes,
                                      " (the tensors must tile the data)"));
  }
  return absl::OkStatus();
}

uint64_t ReadLength(const unsigned char* p) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | p[i];
  return n;
}

absl::Status CheckHeaderLength(const std::string& path, uint64_t header_len, uint64_t file_size) {
  if (header_len > kMaxHeaderBytes || header_len > file_size - 8) {
    return Corrupt(path, absl::StrCat("header length ", header_len, " does not fit a ", file_size,
                                      "-byte file (at most ", kMaxHeaderBytes, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t TensorInfo::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);  // validated by ParseSafetensorsHeader: no wrap
  return n;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::string_view header_json, uint64_t data_bytes,
                                                         const std::string& path) {
  absl::StatusOr<json> parsed = ParseGuardedJson(header_json, "header");
  if (!parsed.ok()) return Corrupt(path, std::string(parsed.status().message()));
  const json& j = *parsed;
  if (!j.is_object()) return Corrupt(path, "the header is not a JSON object");
  SafetensorsHeader h;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return Corrupt(path, "__metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) {
          return Corrupt(path, absl::StrCat("__metadata__ '", m.key(), "' is not a string"));
        }
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    STRATA_ASSIGN_OR_RETURN(TensorInfo t, ParseEntry(path, it.key(), it.value(), data_bytes));
    h.tensors.push_back(std::move(t));
  }
  STRATA_RETURN_IF_ERROR(CheckTiling(path, h.tensors, data_bytes));
  return h;
}

absl::Status ValidateSafetensorsHeader(std::string_view file_bytes) {
  const std::string path = "<memory>";
  if (file_bytes.size() < 8)
    return Corrupt(path, absl::StrCat("only ", file_bytes.size(), " bytes: too short for a header"));
  const uint64_t header_len = ReadLength(reinterpret_cast<const unsigned char*>(file_bytes.data()));
  STRATA_RETURN_IF_ERROR(CheckHeaderLength(path, header_len, file_bytes.size()));
  return ParseSafetensorsHeader(file_bytes.substr(8, header_len), file_bytes.size() - 8 - header_len, path).status();
}

absl::StatusOr<SafetensorsReader> SafetensorsReader::Open(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors file '", path, "' is a directory, not a file"));
  }
  // A FIFO would block the open below until a writer came; a device has no size to check offsets against.
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors file '", path, "' is not a regular file"));
  }
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open safetensors file '", path, "'"));
  const uint64_t file_size = static_cast<uint64_t>(f.tellg());
  f.seekg(0);
  unsigned char len_bytes[8];
  if (file_size < 8 || !f.read(reinterpret_cast<char*>(len_bytes), 8)) {
    return Corrupt(path, absl::StrCat("only ", file_size, " bytes: too short for a header"));
  }
  const uint64_t header_len = ReadLength(len_bytes);
  STRATA_RETURN_IF_ERROR(CheckHeaderLength(path, header_len, file_size));
  std::string header(header_len, '\0');
  if (!f.read(header.data(), static_cast<std::streamsize>(header_len))) {
    return Corrupt(path, "short read of the header");
  }
  STRATA_ASSIGN_OR_RETURN(SafetensorsHeader h, ParseSafetensorsHeader(header, file_size - 8 - header_len, path));
  SafetensorsReader r;
  r.path_ = path;
  r.data_start_ = 8 + header_len;
  r.tensors_ = std::move(h.tensors);
  r.metadata_ = std::move(h.metadata);
  return r;
}

const TensorInfo* SafetensorsReader::Find(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::StatusOr<std::vector<float>> SafetensorsReader::ReadF32(const TensorInfo& t) const {
  if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16") {
    return absl::InvalidArgumentError(absl::StrCat("safetensors file '", path_, "': tensor '", t.name, "' is ",
                                                   t.dtype, "; only F32, BF16 and F16 can be loaded"));
  }
  std::ifstream f(path_, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot reopen '", path_, "'"));
  std::string raw(t.end - t.begin, '\0');
  f.seekg(static_cast<std::streamoff>(data_start_ + t.begin));
  if (!f.read(raw.data(), static_cast<std::streamsize>(raw.size()))) {
    return Corrupt(path_, absl::StrCat("short read of tensor '", t.name, "'"));
  }
  std::vector<float> out(t.numel());
  if (t.dtype == "F32") {
    std::memcpy(out.data(), raw.data(), raw.size());
  } else {
    const bool bf16 = t.dtype == "BF16";
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, raw.data() + 2 * i, 2);
      out[i] = bf16 ? kernels::Bf16ToFloat(h) : kernels::HalfToFloat(h);
    }
  }
  return out;
}

uint64_t TensorToWrite::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

namespace {

std::string HeaderJson(const std::vector<TensorToWrite>& tensors, const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();  // "{}" with no tensors, not "null"
  if (!metadata.empty()) j["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const uint64_t n = t.numel();
    j[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + 4 * n}}};
    offset += 4 * n;
  }
  std::string h = j.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // keep the data section 8-byte aligned
  return h;
}

}  // namespace

absl::StatusOr<SafetensorsWriter> SafetensorsWriter::Begin(const std::string& path, std::vector<TensorToWrite> tensors,
                                                           const std::map<std::string, std::string>& metadata) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  if (!parent.empty()) STRATA_RETURN_IF_ERROR(MakeDirs(parent));
  STRATA_RETURN_IF_ERROR(CheckReplaceable(path));
  SafetensorsWriter w;
  w.path_ = path;
  w.tmp_ = absl::StrCat(path, ".tmp.", ::getpid());
  auto file = StreamFile::Create(w.tmp_, 0);  // Note [Direct checkpoint writes]: the whole file is one stream
  if (!file.ok()) return Annotate(file.status(), absl::StrCat("writing '", path, "'"));
  w.file_ = std::move(*file);
  w.tensors_ = std::move(tensors);
  const std::string header = HeaderJson(w.tensors_, metadata);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(header.size() >> (8 * i));
  absl::Status s = w.Append(len, 8);
  if (s.ok()) s = w.Append(header.data(), header.size());
  if (!s.ok()) return w.Fail(std::move(s));
  return w;
}

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&& other) noexcept { *this = std::move(other); }

SafetensorsWriter& SafetensorsWriter::operator=(SafetensorsWriter&& other) noexcept {
  if (this != &other) {
    Abandon();  // this one's file, if it was writing one
    path_ = std::move(other.path_);
    tmp_ = std::move(other.tmp_);
    file_ = std::exchange(other.file_, StreamFile());
    at_ = other.at_;
    tensors_ = std::move(other.tensors_);
    next_ = other.next_;
  }
  return *this;
}

SafetensorsWriter::~SafetensorsWriter() { Abandon(); }

void SafetensorsWriter::Abandon() {
  if (file_.fd() < 0) return;
  file_ = StreamFile();
  ::unlink(tmp_.c_str());
}

absl::Status SafetensorsWriter::Append(const void* data, size_t n) {
  STRATA_RETURN_IF_ERROR(file_.Write(data, n, at_));
  at_ += n;
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Fail(absl::Status s) {
  if (!s.ok()) Abandon();
  return s;
}

absl::Status SafetensorsWriter::CheckOpen(const char* what) const {
  if (file_.fd() >= 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("safetensors file '", path_, "': ", what, " after the writer failed or finished"));
}

absl::Status SafetensorsWriter::WriteTensor(absl::Span<const float> values) {
  STRATA_RETURN_IF_ERROR(CheckOpen("WriteTensor"));
  const TensorToWrite* t = next();
  if (t == nullptr) {
    return Fail(absl::InternalError(
        absl::StrCat("safetensors file '", path_, "': a tensor written after its ", tensors_.size(), " tensors")));
  }
  if (values.size() != t->numel()) {
    return Fail(absl::InternalError(
        absl::StrCat("tensor '", t->name, "' produced ", values.size(), " values for ", t->numel())));
  }
  STRATA_RETURN_IF_ERROR(Fail(Append(values.data(), values.size() * 4)));
  ++next_;
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Finish() {
  STRATA_RETURN_IF_ERROR(CheckOpen("Finish"));
  if (next() != nullptr) {
    return Fail(absl::InternalError(absl::StrCat("safetensors file '", path_, "': finished after ", next_, " of its ",
                                                 tensors_.size(), " tensors")));
  }
  STRATA_RETURN_IF_ERROR(Fail(file_.Flush()));
  if (::fsync(file_.fd()) != 0) return Fail(Annotate(ErrnoError("fsync", errno, __FILE__, __LINE__), tmp_));
  absl::Status s = std::exchange(file_, StreamFile()).Close();
  if (s.ok() && ::rename(tmp_.c_str(), path_.c_str()) != 0) {
    s = Annotate(ErrnoError("rename", errno, __FILE__, __LINE__), absl::StrCat(tmp_, " -> ", path_));
  }
  if (!s.ok()) ::unlink(tmp_.c_str());
  return s;
}
}  // namespace strata::checkpoint
