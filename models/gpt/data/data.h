// Training data for the GPT trainer: token files, the distributed sampler and a loader thread.
//
// Inputs: llm.c token files (256 x int32 header: magic 20240520, version 1, token count; then uint16
// tokens), any other file as plain text (one token per byte), or the embedded default corpus.
//
// The sampler cuts the tokens into windows of seq_len + 1 (stride seq_len). Global sample i of the run
// is window perm_e[i mod W] of epoch e = i / W, where perm_e is a permutation seeded by (seed, e) alone
// (identity with sequential order), so the global order depends only on the seed and the epoch, never on
// the world size. Step s uses global samples [s*G, (s+1)*G); rank r's micro-batch a takes samples
// s*G + (a*world + r)*micro + j, j < micro. Runs at different world sizes therefore see the same global
// batches, split differently.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::gpt {

// Loads tokens from `path`; "" means the embedded corpus. Errors name the file and the problem (missing,
// empty, corrupt llm.c header, truncated token data, a token outside [0, vocab)).
absl::StatusOr<std::vector<int32_t>> LoadTokens(const std::string& path, int vocab);

// The same checks on bytes in memory (`name` labels the errors): an llm.c file (it starts with the magic)
// has its header validated in one pass (length, version, token count against the size, checked
// arithmetic), then every token is checked against `vocab`; other bytes are text. Never aborts.
absl::StatusOr<std::vector<int32_t>> DecodeTokens(std::string_view bytes, int vocab, const std::string& name);

// An llm.c header alone, from the file's bytes: the token count, or DataLoss / InvalidArgument (no magic).
// The fuzzers' entry point; never aborts.
absl::StatusOr<int64_t> ValidateTokenFileHeader(std::string_view bytes);

// The embedded default corpus (text).
std::string_view EmbeddedCorpus();

enum class DataOrder { kShuffled, kSequential };

class Sampler {
 public:
  // InvalidArgument when the data holds fewer than seq_len + 1 tokens.
  static absl::StatusOr<Sampler> Create(int64_t num_tokens, int seq_len, uint64_t seed, DataOrder order);
  // Start offset (in tokens) of global sample `index`.
  int64_t WindowStart(int64_t index);
  int64_t num_windows() const { return windows_; }

 private:
  int64_t windows_ = 0;
  int seq_len_ = 0;
  uint64_t seed_ = 0;
  DataOrder order_ = DataOrder::kShuffled;
  int64_t perm_epoch_ = -1;
  std::vector<int64_t> perm_;
};

struct Batch {
  int64_t step = 0;
  int micro = 0;
  std::vector<int32_t> inputs;   // B x T
  std::vector<int32_t> targets;  // B x T (inputs shifted by one)
};

// Prepares this rank's micro-batches ahead on a background thread (a bounded queue of `depth`).
class Loader {
 public:
  Loader(const std::vector<int32_t>* tokens, Sampler sampler, int seq_len, int64_t global_batch, int micro_batch,
         int accum, int world, int rank, int64_t first_step, int depth = 4);
  ~Loader();
  // Blocks until the next micro-batch (in step, micro order) is ready. Records the wait.
  Batch Next();
  double wait_seconds() const { return wait_s_; }
  // Artificial delay per batch, waited in Next() and counted in its wait (tests of the data-wait diagnostic).
  void set_delay_us(int64_t us) { delay_us_ = us; }

 private:
  void Run();
  Batch Make(int64_t step, int micro);

  const std::vector<int32_t>* tokens_;
  Sampler sampler_;
  const int seq_len_;
  const int64_t global_batch_;
  const int micro_batch_, accum_, world_, rank_;
  const int depth_;
  int64_t next_step_;
  int next_micro_ = 0;
  std::atomic<int64_t> delay_us_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> queue_;
  bool stop_ = false;
  double wait_s_ = 0;
  std::thread thread_;
};

}  // namespace strata::gpt
