// Token loading and the distributed sampler: llm.c files, text, errors; the global order depends only on
// the seed and the epoch (never on the world size), each epoch is a permutation, and the ranks of any
// world size together read exactly the global batch.
#include "models/gpt/data/data.h"

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

// The llm.c header is validated in one pass: count against the size with checked arithmetic (a negative or
// huge count never allocates), no trailing bytes, a header cut short is not read as text.
TEST(LoadTokens, TheLlmcHeaderIsValidatedAgainstTheSize) {
  auto negative = LoadTokens(TempFile("neg.bin", Llmc(1, -5, {1, 2})), 256);
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(negative.status().message().find("promises -5 tokens"), absl::string_view::npos) << negative.status();
  auto huge = LoadTokens(TempFile("huge.bin", Llmc(1, 2147483647, {1, 2})), 256);
  EXPECT_NE(huge.status().message().find("promises 2147483647 tokens but the file holds 2"), absl::string_view::npos)
      << huge.status();
  auto trailing = LoadTokens(TempFile("trail.bin", Llmc(1, 1, {1, 2, 3})), 256);
  EXPECT_NE(trailing.status().message().find("promises 1 tokens but the file holds 3 (trailing data"),
            absl::string_view::npos) << trailing.status();
  auto odd = LoadTokens(TempFile("odd.bin", Llmc(1, 1, {1}) + "x"), 256);
  EXPECT_NE(odd.status().message().find("odd byte"), absl::string_view::npos) << odd.status();
  auto cut = LoadTokens(TempFile("cut.bin", Llmc(1, 1, {1}).substr(0, 100)), 256);
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss) << "a header cut short is not text";
  EXPECT_NE(cut.status().message().find("header cut short: 100 bytes of 1024"), absl::string_view::npos)
      << cut.status();
  auto dir = LoadTokens(::testing::TempDir(), 256);
  EXPECT_NE(dir.status().message().find("is a directory"), absl::string_view::npos) << dir.status();
}

TEST(ValidateTokenFileHeader, PureOnBytesAndNeverAborts) {
  auto ok = ValidateTokenFileHeader(Llmc(1, 3, {5, 300, 50256}));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, 3);
  EXPECT_EQ(ValidateTokenFileHeader("plain text").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(ValidateTokenFileHeader("").ok());
  EXPECT_FALSE(ValidateTokenFileHeader(Llmc(1, 3, {1})).ok());
  const std::string full = Llmc(1, 2, {1, 2});
  for (size_t n = 0; n < full.size(); ++n) EXPECT_FALSE(ValidateTokenFileHeader(full.substr(0, n)).ok()) << n;
  auto decoded = DecodeTokens(full, 2, "mem");
  EXPECT_NE(decoded.status().message().find("token 2 at position 1"), absl::string_view::npos) << decoded.status();
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
