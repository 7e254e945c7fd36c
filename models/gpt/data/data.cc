#include "models/gpt/data/data.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "runtime/base/input_file.h"
#include "runtime/base/status.h"

extern "C" {
extern const char strata_corpus_begin[];
extern const char strata_corpus_end[];
}

namespace strata::gpt {

std::string_view EmbeddedCorpus() {
  return std::string_view(strata_corpus_begin, static_cast<size_t>(strata_corpus_end - strata_corpus_begin));
}

namespace {

constexpr int32_t kLlmcMagic = 20240520;
constexpr size_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

int32_t HeaderWord(std::string_view bytes, int i) {
  int32_t w;
  std::memcpy(&w, bytes.data() + 4 * i, 4);
  return w;
}

bool StartsWithMagic(std::string_view bytes) { return bytes.size() >= 4 && HeaderWord(bytes, 0) == kLlmcMagic; }

absl::StatusOr<int64_t> CheckLlmcHeader(std::string_view bytes, const std::string& name) {
  if (bytes.size() < kLlmcHeaderBytes) {
    return absl::DataLossError(absl::StrCat("token file '", name, "': llm.c header cut short: ", bytes.size(),
                                            " bytes of ", kLlmcHeaderBytes));
  }
  const int32_t version = HeaderWord(bytes, 1);
  if (version != 1) {
    return absl::DataLossError(absl::StrCat("token file '", name, "': llm.c header version ", version,
                                            ", only version 1 (uint16 tokens) is supported"));
  }
  const int64_t count = HeaderWord(bytes, 2);
  const uint64_t data_bytes = bytes.size() - kLlmcHeaderBytes;
  const int64_t have = static_cast<int64_t>(data_bytes / 2);
  uint64_t need_bytes = 0;
  const bool overflow = count < 0 || __builtin_mul_overflow(static_cast<uint64_t>(count), uint64_t{2}, &need_bytes);
  if (overflow || need_bytes != data_bytes) {
    return absl::DataLossError(absl::StrCat(
        "token file '", name, "': header promises ", count, " tokens but the file holds ", have,
        data_bytes % 2 != 0 ? " and an odd byte" : "",
        overflow || need_bytes > data_bytes ? " (truncated?)" : " (trailing data after the tokens?)"));
  }
  return count;
}

}  // namespace

absl::StatusOr<int64_t> ValidateTokenFileHeader(std::string_view bytes) {
  if (!StartsWithMagic(bytes)) {
    return absl::InvalidArgumentError("not an llm.c token file (magic 20240520 missing)");
  }
  return CheckLlmcHeader(bytes, "<memory>");
}

absl::StatusOr<std::vector<int32_t>> DecodeTokens(std::string_view bytes, int vocab, const std::string& name) {
  if (bytes.empty()) return absl::InvalidArgumentError(absl::StrCat("data file '", name, "' is empty"));
  const bool llmc = StartsWithMagic(bytes);
  std::vector<int32_t> tokens;
  if (llmc) {
    STRATA_ASSIGN_OR_RETURN(const int64_t count, CheckLlmcHeader(bytes, name));
    tokens.resize(static_cast<size_t>(count));
    const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + kLlmcHeaderBytes;
    for (int64_t i = 0; i < count; ++i) tokens[i] = p[2 * i] | (p[2 * i + 1] << 8);
  } else {
    tokens.assign(bytes.begin(), bytes.end());
    for (int32_t& t : tokens) t &= 0xff;  // bytes, not signed chars
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data file '", name, "': token ", tokens[i], " at position ", i, " is outside the model's vocabulary of ",
          vocab, llmc ? "" : " (plain text is read as bytes: use --vocab 256 or more)"));
    }
  }
  return tokens;
}

absl::StatusOr<std::vector<int32_t>> LoadTokens(const std::string& path, int vocab) {
  if (path.empty()) return DecodeTokens(EmbeddedCorpus(), vocab, "<embedded corpus>");
  STRATA_ASSIGN_OR_RETURN(const std::string bytes,
                          ReadInputFile(path, "data file", MaxTokenFileBytes(), InputKind::kRegularFileOrFifo));
  return DecodeTokens(bytes, vocab, path);
}

absl::StatusOr<Sampler> Sampler::Create(int64_t num_tokens, int seq_len, uint64_t seed, DataOrder order) {
  Sampler s;
  s.seq_len_ = seq_len;
  s.seed_ = seed;
  s.order_ = order;
  s.windows_ = num_tokens > seq_len ? (num_tokens - 1) / seq_len : 0;
  if (s.windows_ == 0) {
    return absl::InvalidArgumentError(absl::StrCat("the data holds ", num_tokens, " tokens; --seq-len ", seq_len,
                                                   " needs at least ", seq_len + 1));
  }
  return s;
}

int64_t Sampler::WindowStart(int64_t index) {
  const int64_t epoch = index / windows_, pos = index % windows_;
  if (order_ == DataOrder::kSequential) return pos * seq_len_;
  if (epoch != perm_epoch_) {
    perm_.resize(windows_);
    for (int64_t i = 0; i < windows_; ++i) perm_[i] = i;
    std::mt19937_64 rng(seed_ * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(epoch) + 1);
    for (int64_t i = windows_ - 1; i > 0; --i) {  // Fisher-Yates with an explicit, portable draw
      const int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
      std::swap(perm_[i], perm_[j]);
    }
    perm_epoch_ = epoch;
  }
  return perm_[pos] * seq_len_;
}

Loader::Loader(const std::vector<int32_t>* tokens, Sampler sampler, int seq_len, int64_t global_batch,
               int micro_batch, int accum, int world, int rank, int64_t first_step, int depth)
    : tokens_(tokens), sampler_(std::move(sampler)), seq_len_(seq_len), global_batch_(global_batch),
      micro_batch_(micro_batch), accum_(accum), world_(world), rank_(rank), depth_(depth), next_step_(first_step) {
  thread_ = std::thread([this] { Run(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Batch Loader::Make(int64_t step, int micro) {
  Batch b;
  b.step = step;
  b.micro = micro;
  const size_t T = static_cast<size_t>(seq_len_);
  b.inputs.resize(static_cast<size_t>(micro_batch_) * T);
  b.targets.resize(b.inputs.size());
  for (int j = 0; j < micro_batch_; ++j) {
    const int64_t sample = step * global_batch_ + (int64_t{micro} * world_ + rank_) * micro_batch_ + j;
    const int64_t start = sampler_.WindowStart(sample);
    std::copy_n(tokens_->begin() + start, T, b.inputs.begin() + j * T);
    std::copy_n(tokens_->begin() + start + 1, T, b.targets.begin() + j * T);
  }
  return b;
}

void Loader::Run() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || static_cast<int>(queue_.size()) < depth_; });
      if (stop_) return;
    }
    Batch b = Make(next_step_, next_micro_);
    if (++next_micro_ == accum_) {
      next_micro_ = 0;
      ++next_step_;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(b));
    }
    cv_.notify_all();
  }
}

Batch Loader::Next() {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !queue_.empty(); });
  Batch b = std::move(queue_.front());
  queue_.pop_front();
  lock.unlock();
  cv_.notify_all();
  // The test delay is waited here, by the consumer, so that every batch's wait is at least the delay: slept in
  // the background thread it hid behind any step slower than it (a loaded host), and the test was luck.
  if (delay_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return b;
}

}  // namespace strata::gpt
