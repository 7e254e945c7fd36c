// Tests for models/gpt/train/run_files: the metrics file names the errno of a failed write (a full disk,
// too many open files) and never keeps half a line; outputs are checked before training (unwritable,
// the same file twice, a directory in a file's place) and dead writers' temporaries are swept; a
// checkpoint directory refuses another run's steps and this run's later steps, pruning touches only
// this run's steps and removes step directories without a manifest (Note [A directory per run]).
#include "models/gpt/train/run_files.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/checkpoint/manifest.h"
#include "runtime/checkpoint/step_dirs.h"

namespace strata::tools {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

class RunFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("run_files_test." + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A complete step directory of run `run_id` (a manifest with only the trainer state: enough here).
  void Step(int64_t step, const std::string& run_id) {
    const fs::path d = dir_ / "ck" / checkpoint::StepDirName(step);
    fs::create_directories(d);
    checkpoint::Manifest m;
    m.step = step;
    m.param_dtype = "fp32";
    m.optimizer = "adamw";
    m.shards.push_back({0, "shard_00000.bin", 0, 0});
    TrainOptions o;
    TrainerState t;
    t.next_step = step;
    t.global_batch = 1;
    t.run_id = run_id;
    m.trainer_json = TrainerStateJson(o, t);
    std::ofstream(d / checkpoint::kManifestName) << checkpoint::ToJson(m);
  }
  std::string Ck() const { return (dir_ / "ck").string(); }

  fs::path dir_;
};

TEST_F(RunFiles, MetricsOnAFullDiskNamesTheErrno) {
  MetricsFile m;
  ASSERT_TRUE(m.Open("/dev/full", 0).ok());
  const absl::Status s = m.Append("{\"step\":1}\n");
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("--metrics"), HasSubstr("/dev/full"), HasSubstr("No space")))
      << s;
}

TEST_F(RunFiles, MetricsWithTooManyOpenFilesNamesTheErrno) {
  struct rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  std::vector<int> fds;  // use up the descriptors under a lowered limit
  struct rlimit low = old;
  low.rlim_cur = 16;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  for (int fd; (fd = ::dup(0)) >= 0;) fds.push_back(fd);
  MetricsFile m;
  const absl::Status s = m.Open((dir_ / "m.jsonl").string(), 0);
  for (int fd : fds) ::close(fd);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("--metrics"), HasSubstr("Too many open files"))) << s;
}

TEST_F(RunFiles, ResumedMetricsKeepTheLinesUpToTheStepAndAppend) {
  const std::string path = (dir_ / "m.jsonl").string();
  std::ofstream(path) << "{\"step\":1}\n{\"step\":2}\n{\"step\":3}\n{\"ste";
  {
    MetricsFile m;
    ASSERT_TRUE(m.Open(path, 2).ok());
    ASSERT_TRUE(m.Append("{\"step\":3,\"new\":1}\n").ok());
    ASSERT_TRUE(m.Close().ok());
  }
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "{\"step\":1}\n{\"step\":2}\n{\"step\":3,\"new\":1}\n");
}

TEST_F(RunFiles, OutputsAreCheckedBeforeTraining) {
  TrainOptions o;
  o.metrics = (dir_ / "same").string();
  o.trace = (dir_ / "same").string();
  EXPECT_THAT(std::string(CheckOutputs(o, 0).message()), HasSubstr("--metrics and --trace name the same file"));
  // Paths that do not exist yet, written differently, still name one file (weakly_canonical alone missed them).
  const std::string cwd = fs::current_path().string();
  fs::current_path(dir_);
  o = TrainOptions();
  o.metrics = "new.json";
  o.trace = "./sub/../new.json";
  const std::string relative = std::string(CheckOutputs(o, 0).message());
  o = TrainOptions();
  o.metrics = "tokens.bin";
  o.data = (dir_ / "tokens.bin").string();  // an output over an input
  const std::string over_input = std::string(CheckOutputs(o, 0).message());
  fs::current_path(cwd);
  EXPECT_THAT(relative, HasSubstr("--metrics and --trace name the same file"));
  EXPECT_THAT(over_input, HasSubstr("--metrics and --data name the same file"));
  o = TrainOptions();
  o.save_weights = dir_.string();
  EXPECT_THAT(std::string(CheckOutputs(o, 0).message()), HasSubstr("is a directory"));
  if (::geteuid() != 0) {  // root writes anywhere: the permission case needs an ordinary user
    fs::create_directories(dir_ / "ro");
    fs::permissions(dir_ / "ro", fs::perms::owner_read | fs::perms::owner_exec);
    o = TrainOptions();
    o.save_weights = (dir_ / "ro" / "w.safetensors").string();
    EXPECT_THAT(std::string(CheckOutputs(o, 0).message()), HasSubstr("--save-weights"));
  }
  o = TrainOptions();
  o.checkpoint_dir = "/proc/strata_no_such_dir";  // cannot be created, whoever runs the test
  EXPECT_THAT(std::string(CheckOutputs(o, 3).message()), HasSubstr("--checkpoint-dir"));
}

TEST_F(RunFiles, StaleTemporariesOfDeadWritersAreSwept) {
  const fs::path w = dir_ / "w.safetensors";
  pid_t dead = ::fork();  // a pid that is surely not running: a child that has exited and been reaped
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  int status = 0;
  ::waitpid(dead, &status, 0);
  const std::string stale = w.string() + ".tmp." + std::to_string(dead);
  const std::string live = w.string() + ".tmp." + std::to_string(::getppid());  // a running writer's
  std::ofstream(stale) << "x";
  std::ofstream(live) << "x";
  TrainOptions o;
  o.save_weights = w.string();
  ASSERT_TRUE(CheckOutputs(o, 0).ok());
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
}

TEST_F(RunFiles, ACheckpointDirectoryBelongsToOneRun) {
  Step(2, "aa");
  Step(4, "aa");
  // A new run: refused, naming the steps and both fixes.
  EXPECT_THAT(std::string(CheckCheckpointDir(Ck(), "bb", 0, false).message()),
              AllOf(HasSubstr("another run"), HasSubstr("step_00000002, step_00000004"), HasSubstr("--resume")));
  // The same run resumed from its newest step: fine; from an older one (a rollback): refused.
  EXPECT_TRUE(CheckCheckpointDir(Ck(), "aa", 4, false).ok());
  EXPECT_THAT(std::string(CheckCheckpointDir(Ck(), "aa", 2, false).message()),
              AllOf(HasSubstr("after step 2"), HasSubstr("step_00000004"), HasSubstr("move them")));
  // Steps written before runs had identities count as the run that resumes one of them.
  Step(6, "");
  EXPECT_TRUE(CheckCheckpointDir(Ck(), "aa", 6, true).ok());
  EXPECT_FALSE(CheckCheckpointDir(Ck(), "aa", 6, false).ok());
}

TEST_F(RunFiles, ResumingADirectoryOfSeveralRunsIsRefused) {
  Step(1, "");  // from before run identities: owned by whichever run resumes it, no other run's
  Step(2, "aa");
  EXPECT_TRUE(CheckOneRun(Ck()).ok());
  Step(3, "bb");
  EXPECT_THAT(std::string(CheckOneRun(Ck()).message()),
              AllOf(HasSubstr("2 different runs"), HasSubstr("step_00000003")));
  EXPECT_TRUE(CheckOneRun(Ck() + "/step_00000002").ok());  // a step directory names itself
}

TEST_F(RunFiles, ADamagedStepIsIgnoredNotABlock) {
  Step(2, "aa");
  Step(4, "aa");
  std::ofstream(dir_ / "ck" / "step_00000002" / checkpoint::kManifestName) << "{\"format\": ";
  EXPECT_TRUE(CheckCheckpointDir(Ck(), "aa", 4, false).ok());
  EXPECT_TRUE(CheckOneRun(Ck()).ok());
}

TEST_F(RunFiles, FilesAreComparedByContents) {
  std::ofstream(dir_ / "a") << std::string(3 << 20, 'x');
  std::ofstream(dir_ / "b") << std::string(3 << 20, 'x');
  std::string c(3 << 20, 'x');
  c[(3 << 20) - 5] = 'y';  // in the last MiB
  std::ofstream(dir_ / "c") << c;
  EXPECT_EQ(FileFingerprint((dir_ / "a").string()), FileFingerprint((dir_ / "b").string()));
  EXPECT_NE(FileFingerprint((dir_ / "a").string()), FileFingerprint((dir_ / "c").string()));
  EXPECT_THAT(FileFingerprint((dir_ / "none").string()), HasSubstr("unreadable"));
  // A Hugging Face directory: its weight files by name; two copies agree, a changed shard or index does not.
  for (const char* d : {"hf1", "hf2"}) {
    fs::create_directories(dir_ / d);
    std::ofstream(dir_ / d / "model-00001-of-00002.safetensors") << "weights";
    std::ofstream(dir_ / d / "model.safetensors.index.json") << "{}";
    std::ofstream(dir_ / d / "README.md") << d;  // not a weight file
  }
  EXPECT_EQ(FileFingerprint((dir_ / "hf1").string()), FileFingerprint((dir_ / "hf2").string()));
  EXPECT_THAT(FileFingerprint((dir_ / "hf1").string()), HasSubstr("model-00001-of-00002.safetensors: "));
  std::ofstream(dir_ / "hf2" / "model.safetensors.index.json") << "{ }";
  EXPECT_NE(FileFingerprint((dir_ / "hf1").string()), FileFingerprint((dir_ / "hf2").string()));
}

TEST_F(RunFiles, PruningKeepsOtherRunsAndRemovesIncompleteSteps) {
  Step(1, "other");
  Step(2, "aa");
  Step(3, "aa");
  Step(4, "aa");
  fs::create_directories(dir_ / "ck" / "step_00000005");  // a save that was killed: shards, no manifest
  std::ofstream(dir_ / "ck" / "step_00000005" / "shard_00000.bin") << "x";
  fs::create_directories(dir_ / "ck" / "step_00000009");  // the save just made (its manifest comes last)
  PruneCheckpoints(Ck(), "aa", false, 2, Ck() + "/step_00000009");
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir_ / "ck")) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"step_00000001", "step_00000003", "step_00000004", "step_00000009"}));
}

TEST_F(RunFiles, TrainerStateRoundTripsItsIdentityAndData) {
  TrainOptions o;
  TrainerState t;
  t.next_step = 7;
  t.global_batch = 8;
  t.run_id = NewRunId();
  t.data_fingerprint = TokensFingerprint({1, 2, 3});
  t.owns_legacy = true;
  auto back = ParseTrainerState(TrainerStateJson(o, t), "x/step_00000007");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->run_id, t.run_id);
  EXPECT_EQ(back->data_fingerprint, t.data_fingerprint);
  EXPECT_EQ(back->data_order, "shuffled");
  EXPECT_TRUE(back->owns_legacy);
  EXPECT_NE(TokensFingerprint({1, 2, 3}), TokensFingerprint({1, 3, 2}));
  EXPECT_EQ(t.run_id.size(), 32u);
  EXPECT_NE(NewRunId(), NewRunId());
  EXPECT_FALSE(ParseTrainerState(R"({"next_step":7,"run_id":"../x"})", "x/step_00000007").ok());
}

}  // namespace
}  // namespace strata::tools
