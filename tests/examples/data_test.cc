// Token loading and the distributed sampler: llm.c files, text, errors; the global order depends only on
// the seed and the epoch (never on the world size), each epoch is a permutation, and the ranks of any
// world size together read exactly the global batch.
#include "examples/gpt/data.h"

#include <cstdio>
#include <fstream>
#include <set>

#include "gtest/gtest.h"

namespace strata::gpt {
namespace {

std::string TempFile(const std::string& name, const std::string& bytes) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string Llmc(int version, int count, const std::vector<uint16_t>& tokens) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = version;
  header[2] = count;
  std::string s(reinterpret_cast<const char*>(header.data()), 1024);
  s.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  return s;
}

TEST(LoadTokens, ReadsLlmcFilesTextAndTheEmbeddedCorpus) {
  auto t = LoadTokens(TempFile("ok.bin", Llmc(1, 3, {5, 300, 50256})), 50257);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, std::vector<int32_t>({5, 300, 50256}));
  auto text = LoadTokens(TempFile("t.txt", "h\xc3\xa9"), 256);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, std::vector<int32_t>({'h', 0xc3, 0xa9})) << "bytes are unsigned tokens";
  auto corpus = LoadTokens("", 256);
  ASSERT_TRUE(corpus.ok());
  EXPECT_GT(corpus->size(), 200000u);
  EXPECT_EQ(corpus->size(), EmbeddedCorpus().size());
}

TEST(LoadTokens, BadInputsAreNamedErrors) {
  EXPECT_EQ(LoadTokens("/nonexistent/x.bin", 256).status().code(), absl::StatusCode::kNotFound);
  auto trunc = LoadTokens(TempFile("trunc.bin", Llmc(1, 100, {1, 2})), 256);
  EXPECT_NE(trunc.status().message().find("promises 100 tokens"), absl::string_view::npos) << trunc.status();
  auto ver = LoadTokens(TempFile("ver.bin", Llmc(2, 1, {1})), 256);
  EXPECT_NE(ver.status().message().find("version 2"), absl::string_view::npos) << ver.status();
  auto vocab = LoadTokens(TempFile("vocab.bin", Llmc(1, 2, {1, 999})), 256);
  EXPECT_NE(vocab.status().message().find("token 999"), absl::string_view::npos) << vocab.status();
  EXPECT_FALSE(LoadTokens(TempFile("empty.txt", ""), 256).ok());
}

TEST(Sampler, EachEpochIsAPermutationReshuffledPerEpoch) {
  auto s = Sampler::Create(1001, 10, 7, DataOrder::kShuffled);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->num_windows(), 100);
  std::vector<int64_t> e0, e1;
  for (int i = 0; i < 100; ++i) e0.push_back(s->WindowStart(i));
  for (int i = 100; i < 200; ++i) e1.push_back(s->WindowStart(i));
  EXPECT_EQ(std::set<int64_t>(e0.begin(), e0.end()).size(), 100u);
  EXPECT_EQ(std::set<int64_t>(e0.begin(), e0.end()), std::set<int64_t>(e1.begin(), e1.end()));
  EXPECT_NE(e0, e1) << "epochs must be reshuffled";
  for (int64_t w : e0) EXPECT_EQ(w % 10, 0);
  auto seq = Sampler::Create(1001, 10, 7, DataOrder::kSequential);
  EXPECT_EQ(seq->WindowStart(3), 30);
  EXPECT_EQ(seq->WindowStart(103), 30);
  auto other_seed = Sampler::Create(1001, 10, 8, DataOrder::kShuffled);
  std::vector<int64_t> o;
  for (int i = 0; i < 100; ++i) o.push_back(other_seed->WindowStart(i));
  EXPECT_NE(o, e0);
}

TEST(Sampler, DataShorterThanOneWindowIsAnError) {
  auto s = Sampler::Create(10, 10, 1, DataOrder::kShuffled);
  EXPECT_NE(s.status().message().find("needs at least 11"), absl::string_view::npos) << s.status();
}

// Every rank's micro-batches of step s, together, are the world-1 run's global batch of step s.
TEST(Loader, RanksOfAnyWorldSizeReadTheSameGlobalBatches) {
  std::vector<int32_t> tokens(5000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % 251);
  const int T = 16, global = 12, steps = 3;
  auto batches = [&](int world, int accum) {
    std::multiset<std::vector<int32_t>> out;
    for (int r = 0; r < world; ++r) {
      Loader l(&tokens, Sampler::Create(5000, T, 3, DataOrder::kShuffled).value(), T, global, global / (world * accum),
               accum, world, r, 0);
      for (int k = 0; k < steps * accum; ++k) {
        Batch b = l.Next();
        for (size_t j = 0; j < b.inputs.size(); j += T) {
          std::vector<int32_t> seq(b.inputs.begin() + j, b.inputs.begin() + j + T);
          seq.push_back(b.targets[j + T - 1]);
          out.insert(seq);
        }
      }
    }
    return out;
  };
  const auto one = batches(1, 1);
  EXPECT_EQ(one.size(), size_t(steps * global));
  EXPECT_EQ(batches(2, 1), one);
  EXPECT_EQ(batches(4, 3), one);
  EXPECT_EQ(batches(3, 2), one);
}

}  // namespace
}  // namespace strata::gpt
