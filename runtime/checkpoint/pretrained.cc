// Note [Pretrained by byte ranges] (pretrained.h); docs/decisions/0037-pretrained-by-byte-ranges.md.
#include "runtime/checkpoint/pretrained.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/element_math.h"
#include "runtime/base/json_text.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/files.h"

namespace strata::checkpoint {
namespace {

constexpr uint64_t kMaxIndexBytes = 100ull << 20;  // as a header: the format's own limit
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrCat("safetensors file '", path, "': ", what));
}

std::string Strerror(int err) {
  char buf[256];
  return strerror_r(err, buf, sizeof(buf));  // GNU: returns the message pointer
}

uint64_t ElementBytes(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  return 0;  // not read as fp32
}

// Opens a checkpoint file: by its path (a lone file) or confined to `dir` (a name from an index).
absl::StatusOr<Fd> OpenFile(const std::string& dir, const std::string& name, const std::string& path) {
  if (dir.empty()) {
    // O_NONBLOCK: a FIFO opens at once (FileSize then refuses it) instead of waiting for a writer.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      const int err = errno;
      return absl::Status(err == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kPermissionDenied,
                          absl::StrCat("'", path, "': ", Strerror(err)));
    }
    return Fd(fd);
  }
  absl::StatusOr<Fd> fd = OpenInDir(dir, name);
  if (fd.ok()) return fd;
  if (fd.status().code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(absl::StrCat("'", path, "': ", Strerror(ENOENT), " (the index names it)"));
  }
  return Annotate(fd.status(), absl::StrCat("'", path, "'"));
}

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> ParseSafetensorsIndex(std::string_view json_text,
                                                                         const std::string& path) {
  auto bad = [&](const std::string& what) { return absl::DataLossError(absl::StrCat("'", path, "': ", what)); };
  if (json_text.size() > kMaxIndexBytes) {
    return bad(
        absl::StrCat("not a readable JSON index (", json_text.size(), " bytes, more than ", kMaxIndexBytes, ")"));
  }
  absl::StatusOr<nlohmann::json> parsed = ParseGuardedJson(json_text, "index");
  if (!parsed.ok()) return bad(absl::StrCat("not a readable JSON index (", parsed.status().message(), ")"));
  const nlohmann::json& j = *parsed;
  if (!j.is_object() || !j.contains("weight_map") || !j.at("weight_map").is_object() || j.at("weight_map").empty()) {
    return bad("no \"weight_map\" object of tensor names to files");
  }
  std::map<std::string, std::string> map;
  for (auto it = j.at("weight_map").begin(); it != j.at("weight_map").end(); ++it) {
    const auto dump = [](const nlohmann::json& v) {
      return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    };
    if (!it.value().is_string()) {
      return bad(absl::StrCat("tensor '", it.key(), "' names the file ", dump(it.value()).substr(0, 200),
                              ", which is not a plain file name in the directory"));
    }
    const std::string file = it.value().get<std::string>();
    if (absl::Status s = CheckPlainFileName(file); !s.ok()) {
      return bad(absl::StrCat("tensor '", it.key(), "' names the file '", absl::CHexEscape(file.substr(0, 300)),
                              "', which is not a plain file name in the directory (", s.message(), ")"));
    }
    map.emplace(it.key(), file);  // ParseGuardedJson refused repeated keys
  }
  return map;
}

PretrainedCheckpoint::~PretrainedCheckpoint() {
  for (File& f : files_) {
    if (f.fd >= 0) ::close(f.fd);
  }
}

absl::Status PretrainedCheckpoint::AddFile(const std::string& dir, const std::map<std::string, std::string>* weight_map,
                                           const std::string& name) {
  const std::string path = dir.empty() ? name : (std::filesystem::path(dir) / name).string();
  STRATA_ASSIGN_OR_RETURN(Fd fd, OpenFile(dir, name, path));
  STRATA_ASSIGN_OR_RETURN(const uint64_t size, FileSize(fd.get(), path));
  if (size < 8) return Bad(path, absl::StrCat("only ", size, " bytes: too short for a header"));
  unsigned char len[8];
  STRATA_RETURN_IF_ERROR(ReadAt(fd.get(), len, 8, 0, path));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len[i];
  if (header_len > kMaxHeaderBytes || header_len > size - 8) {
    return Bad(path, absl::StrCat("header length ", header_len, " does not fit a ", size, "-byte file (at most ",
                                  kMaxHeaderBytes, ")"));
  }
  std::string header(header_len, '\0');
  STRATA_RETURN_IF_ERROR(ReadAt(fd.get(), header.data(), header_len, 8, path));
  STRATA_ASSIGN_OR_RETURN(SafetensorsHeader h, ParseSafetensorsHeader(header, size - 8 - header_len, path));
  const int index = static_cast<int>(files_.size());
  files_.push_back(File{path, fd.release(), 8 + header_len, size - 8 - header_len});
  for (TensorInfo& t : h.tensors) {
    if (const Tensor* other = Find(t.name)) {
      return Bad(path, absl::StrCat("tensor '", t.name, "': also in '", files_[other->file].path, "'"));
    }
    if (weight_map != nullptr) {
      auto it = weight_map->find(t.name);
      if (it == weight_map->end() || it->second != name) {
        return Bad(path,
                   absl::StrCat("tensor '", t.name, "': the index names ",
                                it == weight_map->end() ? "no file" : absl::StrCat("'", it->second, "'"), " for it"));
      }
    }
    Tensor entry{std::move(t), index};
    auto at = std::lower_bound(tensors_.begin(), tensors_.end(), entry.info.name,
                               [](const Tensor& a, const std::string& n) { return a.info.name < n; });
    tensors_.insert(at, std::move(entry));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PretrainedCheckpoint>> PretrainedCheckpoint::Open(const std::string& path) {
  std::unique_ptr<PretrainedCheckpoint> c(new PretrainedCheckpoint());
  struct stat st;
  const std::string neither = absl::StrCat("neither ", kSafetensorsFileName, " nor ", kSafetensorsIndexName,
                                           " (a Hugging Face checkpoint directory, as save_pretrained writes it)");
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat("'", path, "': ", Strerror(err), ": ", neither));
    return absl::PermissionDeniedError(absl::StrCat("'", path, "': ", Strerror(err)));
  }
  if (!S_ISDIR(st.st_mode)) {
    STRATA_RETURN_IF_ERROR(c->AddFile("", nullptr, path));
    return c;
  }
  const std::string single = (std::filesystem::path(path) / kSafetensorsFileName).string();
  const std::string index_path = (std::filesystem::path(path) / kSafetensorsIndexName).string();
  struct stat ignored;
  if (::lstat(single.c_str(), &ignored) == 0) {
    STRATA_RETURN_IF_ERROR(c->AddFile(path, nullptr, kSafetensorsFileName));
    return c;
  }
  if (::lstat(index_path.c_str(), &ignored) != 0) {
    return absl::NotFoundError(absl::StrCat("'", path, "': ", neither));
  }
  absl::StatusOr<std::string> text = ReadFileInDir(path, kSafetensorsIndexName, kMaxIndexBytes);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("'", index_path, "': not a readable JSON index (", text.status().message(), ")"));
  }
  STRATA_ASSIGN_OR_RETURN(const auto weight_map, ParseSafetensorsIndex(*text, index_path));
  std::set<std::string> names;
  for (const auto& [tensor, file] : weight_map) names.insert(file);
  for (const std::string& name : names) STRATA_RETURN_IF_ERROR(c->AddFile(path, &weight_map, name));
  size_t missing = 0;
  const std::pair<const std::string, std::string>* first = nullptr;
  for (const auto& entry : weight_map) {
    if (c->Find(entry.first) == nullptr && missing++ == 0) first = &entry;
  }
  if (missing > 0) {
    return absl::DataLossError(absl::StrCat("'", index_path, "': tensor '", first->first, "' is not in '",
                                            first->second, "'",
                                            missing > 1 ? absl::StrCat(" (", missing - 1, " more missing)") : ""));
  }
  return c;
}

const PretrainedCheckpoint::Tensor* PretrainedCheckpoint::Find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const Tensor& a, std::string_view n) { return a.info.name < n; });
  return it != tensors_.end() && it->info.name == name ? &*it : nullptr;
}

absl::Status PretrainedCheckpoint::ReadRaw(const Tensor& t, uint64_t offset, void* out, uint64_t bytes) const {
  const uint64_t size = t.info.end - t.info.begin;
  if (offset > size || bytes > size - offset) {
    return absl::OutOfRangeError(
        absl::StrCat("tensor '", t.info.name, "' has ", size, " bytes; [", offset, ", +", bytes, ") is not within it"));
  }
  const File& f = files_[t.file];
  return ReadAt(f.fd, out, bytes, f.data_start + t.info.begin + offset, f.path);
}

absl::Status CheckReadableAsF32(const PretrainedCheckpoint& c, size_t tensor) {
  const auto& t = c.tensors()[tensor];
  if (ElementBytes(t.info.dtype) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors file '", c.files()[t.file].path, "': tensor '",
                                                   t.info.name, "' is ", t.info.dtype,
                                                   "; a parameter is read from F32, BF16 or F16"));
  }
  return absl::OkStatus();
}

namespace {

using Piece = RangeReader::Piece;
using Batch = RangeReader::Batch;

absl::Status CheckRanges(const PretrainedCheckpoint& c, absl::Span<const RangeToRead> ranges) {
  for (const RangeToRead& r : ranges) {
    if (r.tensor >= c.tensors().size()) {
      return absl::OutOfRangeError(absl::StrCat("tensor ", r.tensor, " of ", c.tensors().size()));
    }
    const auto& t = c.tensors()[r.tensor];
    STRATA_RETURN_IF_ERROR(CheckReadableAsF32(c, r.tensor));
    if (r.first > t.info.numel() || r.count > t.info.numel() - r.first) {
      return absl::OutOfRangeError(absl::StrCat("tensor '", t.info.name, "' has ", t.info.numel(), " elements; [",
                                                r.first, ", +", r.count, ") is not within it"));
    }
  }
  return absl::OkStatus();
}

std::vector<Batch> Plan(const PretrainedCheckpoint& c, absl::Span<const RangeToRead> ranges, uint64_t buffer_bytes,
                        uint64_t request_bytes) {
  std::vector<Batch> batches(1);
  for (size_t i = 0; i < ranges.size(); ++i) {
    const uint64_t esize = ElementBytes(c.tensors()[ranges[i].tensor].info.dtype);
    uint64_t first = ranges[i].first;
    uint64_t left = ranges[i].count;
    while (left > 0) {
      Batch* b = &batches.back();
      uint64_t at = (b->bytes + 7) & ~uint64_t{7};
      if (at + esize > buffer_bytes) {
        batches.emplace_back();
        b = &batches.back();
        at = 0;
      }
      const uint64_t n = std::min({left, (buffer_bytes - at) / esize, std::max<uint64_t>(1, request_bytes / esize)});
      b->pieces.push_back(Piece{i, first, n, at});
      b->bytes = at + n * esize;
      first += n;
      left -= n;
    }
  }
  if (batches.back().pieces.empty()) batches.pop_back();
  return batches;
}

void Convert(const std::string& dtype, const char* src, uint64_t count, float* out) {
  if (dtype == "F32") {
    std::memcpy(out, src, count * 4);
    return;
  }
  const bool bf16 = dtype == "BF16";
  for (uint64_t i = 0; i < count; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    out[i] = bf16 ? kernels::Bf16ToFloat(h) : kernels::HalfToFloat(h);
  }
}

}  // namespace

RangeReader::RangeReader(const PretrainedCheckpoint& checkpoint, absl::Span<const RangeToRead> ranges)
    : checkpoint_(checkpoint), ranges_(ranges.begin(), ranges.end()), start_(std::chrono::steady_clock::now()) {}

RangeReader::~RangeReader() {
  for (const offload::IoWork& w : in_flight_) w.Wait().IgnoreError();  // nothing in flight when the buffers go
}

absl::StatusOr<std::unique_ptr<RangeReader>> RangeReader::Open(const PretrainedCheckpoint& checkpoint,
                                                               absl::Span<const RangeToRead> ranges,
                                                               const RangeReadOptions& options) {
  std::unique_ptr<RangeReader> r(new RangeReader(checkpoint, ranges));
  STRATA_RETURN_IF_ERROR(CheckRanges(checkpoint, ranges));
  r->buffer_bytes_ = std::max<uint64_t>(4096, (options.staging_bytes + 4095) & ~uint64_t{4095});
  r->buffer_count_ = std::max<uint32_t>(1, options.staging_buffers);
  r->batches_ = Plan(checkpoint, ranges, r->buffer_bytes_, options.request_bytes);
  r->region_ = std::unique_ptr<char, void (*)(void*)>(
      static_cast<char*>(std::aligned_alloc(4096, r->buffer_bytes_ * r->buffer_count_)), std::free);
  if (r->region_ == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no host memory for ", r->buffer_count_, " staging buffers of ", r->buffer_bytes_, " bytes"));
  }
  offload::IoQueueOptions qo;
  qo.backend = options.backend;
  qo.depth = std::max<uint32_t>(1, options.depth);
  qo.name = "pretrained";
  STRATA_ASSIGN_OR_RETURN(r->queue_, offload::CreateIoQueue(qo));
  r->queue_->SetFaults(options.faults);
  std::vector<memory::BufferView> views;
  for (size_t i = 0; i < r->buffer_count_; ++i) {
    views.push_back(
        memory::BufferView{r->region_.get() + i * r->buffer_bytes_, r->buffer_bytes_, memory::Tier::kPinnedHost});
  }
  r->stats_.registered = r->queue_->backend() == offload::IoBackend::kUring && r->queue_->RegisterBuffers(views).ok();
  r->stats_.backend = r->queue_->description();
  for (; r->next_ < r->batches_.size() && r->next_ < r->buffer_count_; ++r->next_) r->Submit(r->next_);
  return r;
}

void RangeReader::Submit(size_t b) {
  char* base = region_.get() + (b % buffer_count_) * buffer_bytes_;
  std::vector<offload::IoRequest> requests;
  for (const Piece& p : batches_[b].pieces) {
    const RangeToRead& r = ranges_[p.range];
    const auto& t = checkpoint_.tensors()[r.tensor];
    const auto& f = checkpoint_.files()[t.file];
    const uint64_t esize = ElementBytes(t.info.dtype);
    requests.push_back(offload::IoRequest{offload::IoOp::kRead, f.fd, f.path.c_str(), base + p.at, p.count * esize,
                                          f.data_start + t.info.begin + p.first * esize});
  }
  in_flight_.push_back(queue_->Submit(requests));
}

const RangeReader::Piece& RangeReader::piece() const { return batches_[batch_].pieces[piece_]; }

void RangeReader::Hand() {
  const Piece& p = piece();
  const char* base = region_.get() + (batch_ % buffer_count_) * buffer_bytes_;
  values_.resize(p.count);
  Convert(checkpoint_.tensors()[ranges_[p.range].tensor].info.dtype, base + p.at, p.count, values_.data());
  stats_.elements += p.count;
}

absl::StatusOr<bool> RangeReader::Next() {
  STRATA_RETURN_IF_ERROR(failed_);
  if (in_batch_) {
    if (++piece_ < batches_[batch_].pieces.size()) {
      Hand();
      return true;
    }
    // The caller is done with the batch's buffer: the next batch is read into it.
    in_batch_ = false;
    if (next_ < batches_.size()) Submit(next_++);
    ++batch_;
  }
  while (batch_ < batches_.size()) {
    failed_ = in_flight_.front().Wait();
    in_flight_.pop_front();
    STRATA_RETURN_IF_ERROR(failed_);
    if (!batches_[batch_].pieces.empty()) {
      in_batch_ = true;
      piece_ = 0;
      Hand();
      return true;
    }
    if (next_ < batches_.size()) Submit(next_++);
    ++batch_;
  }
  return false;
}

absl::StatusOr<RangeReadStats> RangeReader::Finish() {
  if (in_batch_ || batch_ < batches_.size() || !failed_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("reading byte ranges: finished after ", batch_, " of ",
                                                      batches_.size(), " batches, before the last piece"));
  }
  RangeReadStats stats = stats_;
  const offload::IoQueueStats q = queue_->stats();
  stats.bytes_read = q.bytes_read;
  stats.requests = q.requests;
  stats.fixed_buffer_ios = q.fixed_buffer_ios;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  return stats;
}

absl::StatusOr<SafetensorsDirWriter> SafetensorsDirWriter::Begin(const std::string& dir,
                                                                 std::vector<TensorToWrite> tensors,
                                                                 uint64_t max_shard_bytes,
                                                                 const std::map<std::string, std::string>& metadata) {
  if (max_shard_bytes == 0) return absl::InvalidArgumentError("the maximum shard size is 0 bytes");
  STRATA_RETURN_IF_ERROR(MakeDirs(dir));
  SafetensorsDirWriter w;
  w.dir_ = dir;
  w.metadata_ = metadata;
  // The plan from shapes alone: which tensors go to which file.
  w.files_.resize(1);
  uint64_t in_shard = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t bytes = 4 * tensors[i].numel();
    if (!w.files_.back().empty() && in_shard + bytes > max_shard_bytes) {
      w.files_.emplace_back();
      in_shard = 0;
    }
    w.files_.back().push_back(i);
    in_shard += bytes;
    w.total_ += bytes;
  }
  const size_t n = w.files_.size();
  for (size_t k = 0; k < n; ++k) {
    w.names_.push_back(n == 1 ? kSafetensorsFileName
                              : absl::StrCat("model-", absl::Dec(k + 1, absl::kZeroPad5), "-of-",
                                             absl::Dec(n, absl::kZeroPad5), ".safetensors"));
  }
  w.tensors_ = std::move(tensors);
  STRATA_RETURN_IF_ERROR(w.OpenFile());
  return w;
}

absl::Status SafetensorsDirWriter::OpenFile() {
  std::vector<TensorToWrite> part;
  for (size_t i : files_[file_]) part.push_back(tensors_[i]);
  STRATA_ASSIGN_OR_RETURN(writer_, SafetensorsWriter::Begin((std::filesystem::path(dir_) / names_[file_]).string(),
                                                            std::move(part), metadata_));
  return absl::OkStatus();
}

absl::Status SafetensorsDirWriter::WriteTensor(absl::Span<const float> values) {
  if (!writer_.has_value() || next() == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("exporting to '", dir_, "': a tensor written after ", next_,
                                                      " of ", tensors_.size(), ", with no file open"));
  }
  STRATA_RETURN_IF_ERROR(writer_->WriteTensor(values));
  ++next_;
  if (writer_->next() != nullptr) return absl::OkStatus();
  // The file's last tensor: it goes into place, and the next file opens.
  absl::Status s = writer_->Finish();
  writer_.reset();
  if (s.ok() && ++file_ < files_.size()) s = OpenFile();
  return s;
}

absl::StatusOr<std::vector<std::string>> SafetensorsDirWriter::Finish() {
  if (next() != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("exporting to '", dir_, "': finished after ", next_, " of ", tensors_.size(), " tensors"));
  }
  if (writer_.has_value()) {  // a file without tensors: no tensors at all
    absl::Status s = writer_->Finish();
    writer_.reset();
    STRATA_RETURN_IF_ERROR(s);
  }
  std::vector<std::string> names = names_;
  const size_t n = files_.size();
  const std::string& dir = dir_;
  if (n > 1) {
    nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
    for (size_t k = 0; k < n; ++k) {
      for (size_t i : files_[k]) weight_map[tensors_[i].name] = names_[k];
    }
    nlohmann::ordered_json index;
    index["metadata"]["total_size"] = total_;
    for (const auto& [k, v] : metadata_) index["metadata"][k] = v;
    index["weight_map"] = weight_map;
    STRATA_RETURN_IF_ERROR(
        WriteFileAtomic((std::filesystem::path(dir) / kSafetensorsIndexName).string(), index.dump(2) + "\n"));
    names.push_back(kSafetensorsIndexName);
  }
  // An earlier export's files this one did not replace.
  const std::set<std::string> written(names.begin(), names.end());
  std::error_code ec;
  std::vector<std::filesystem::path> stale;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string f = e.path().filename().string();
    const bool shard = f.rfind("model-", 0) == 0 && f.find("-of-") != std::string::npos && f.size() > 12 &&
                       f.compare(f.size() - 12, 12, ".safetensors") == 0;
    if ((shard || f == kSafetensorsFileName || f == kSafetensorsIndexName) && !written.count(f)) {
      stale.push_back(e.path());
    }
  }
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot list '", dir, "': ", ec.message()));
  for (const auto& path : stale) {
    if (!std::filesystem::remove(path, ec) && ec) {
      return absl::PermissionDeniedError(absl::StrCat("cannot remove the stale '", path.string(), "': ", ec.message()));
    }
  }
  return names;
}

}  // namespace strata::checkpoint
