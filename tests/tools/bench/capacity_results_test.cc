// Note [Interrupted search] (tools/bench/capacity_results.h): a process appending candidates to its
// results file and stopped by SIGTERM or SIGINT at an arbitrary moment (most often while a line is being
// written and synced) exits at once with 128 + the signal, its message names how many lines it finished
// and the file, and the file holds exactly those lines, each whole and valid JSON, in order. (A handler
// that exits without waiting for the line in progress reports one line fewer than the file holds.)
#include "tools/bench/capacity_results.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace strata::tools {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Forks a child that appends numbered 8 KiB lines to `results` until `sig` stops it, `delay_us` after
// its first line; returns the child's wait status. Its stderr goes to `err`.
int RunAndStop(const std::string& results, const std::string& err, int sig, int delay_us) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, STDERR_FILENO);
    CapacityResults r;
    if (!r.Open(results).ok()) _exit(3);
    for (int i = 0;; ++i) {
      if (!r.Append({{"candidate", i}, {"pad", std::string(8192, 'x')}}).ok()) _exit(4);
    }
  }
  while (!std::filesystem::exists(results) || std::filesystem::file_size(results) == 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
  kill(pid, sig);
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

TEST(CapacityResults, StoppedAnywhereLeavesWholeLinesAndNamesThem) {
  char tmpl[] = "/tmp/capacity_results_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  for (int round = 0; round < 12; ++round) {
    const int sig = round % 2 ? SIGINT : SIGTERM;
    const std::string results = dir + "/r" + std::to_string(round) + ".jsonl", err = dir + "/err";
    const int status = RunAndStop(results, err, sig, 300 * round);
    ASSERT_TRUE(WIFEXITED(status)) << "round " << round << ": killed by signal " << WTERMSIG(status);
    EXPECT_EQ(WEXITSTATUS(status), 128 + sig) << "round " << round;
    std::istringstream lines(ReadAll(results));
    int n = 0;
    for (std::string line; std::getline(lines, line); ++n) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      ASSERT_FALSE(j.is_discarded()) << "round " << round << ": line " << n << " is not whole JSON";
      EXPECT_EQ(j["candidate"], n) << "round " << round;
    }
    const std::string text = ReadAll(results);
    EXPECT_TRUE(!text.empty() && text.back() == '\n') << "round " << round << ": the last line is cut";
    const std::string expect = std::string("stopped by ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") +
                               "; finished candidates: " + std::to_string(n) + ", in " + results;
    EXPECT_NE(ReadAll(err).find(expect), std::string::npos) << "round " << round << ": " << ReadAll(err);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata::tools
