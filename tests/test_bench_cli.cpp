// `bonsai bench` end to end on a synthesized tiny model: the llama-bench-shaped
// rows (csv), the -ub/--ubatch-size list (each value runs the pp tests with that
// prefill chunk, the tg tests run once), the -d/--n-depth list (every test again
// after that many context positions) and the refusal of bad values.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "text_cli_run.h"

namespace bonsai {
namespace {

using testing::CliResult;
using testing::run_bonsai;
using testing::shq;

std::vector<std::vector<std::string>> csv_rows(const std::string& out) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> cells;
    std::istringstream l(line);
    for (std::string c; std::getline(l, c, ',');) cells.push_back(c);
    rows.push_back(cells);
  }
  return rows;
}

class BenchCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new testing::TempPath("bench_tiny.gguf");
    const CliResult r = run_bonsai("synth --preset tiny --no-vocab -q -o " + shq(model_->path));
    ASSERT_EQ(r.rc, 0) << r.err;
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  static std::string m() { return " -m " + shq(model_->path) + " --path fast -t 1 --no-bandwidth "; }
  static testing::TempPath* model_;
};
testing::TempPath* BenchCli::model_ = nullptr;

TEST_F(BenchCli, UbatchListRunsPromptTestsPerValue) {
  const CliResult r = run_bonsai("bench" + m() + "-p 9 -n 2 -r 1 -ub 4,9 -o csv");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto rows = csv_rows(r.out);
  ASSERT_EQ(rows.size(), 4u) << r.out;  // header, pp9 at 4 and tg2 (first value), pp9 at 9
  ASSERT_GE(rows[0].size(), 7u);
  EXPECT_EQ(rows[0][5], "n_ubatch");
  EXPECT_EQ(rows[0][6], "test");
  EXPECT_EQ(rows[1][5], "4");
  EXPECT_EQ(rows[1][6], "pp9");
  EXPECT_EQ(rows[2][5], "0");  // tg rows have no prefill chunk
  EXPECT_EQ(rows[2][6], "tg2");
  EXPECT_EQ(rows[3][5], "9");
  EXPECT_EQ(rows[3][6], "pp9");
}

// -ctk lists one session per type (one row per test each, type columns at the end of the csv); the md
// table shows type_k / type_v only when a type is not f32; a mixed or unknown pair is a usage error.
TEST_F(BenchCli, CacheTypeListRunsEachType) {
  const CliResult r = run_bonsai("bench" + m() + "-p 3 -n 2 -r 1 -ctk f32,f16 -o csv");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto rows = csv_rows(r.out);
  ASSERT_EQ(rows.size(), 5u) << r.out;  // header, pp3 and tg2 with f32, then with f16
  ASSERT_EQ(rows[0].size(), 15u) << r.out;
  EXPECT_EQ(rows[0][12], "type_k");
  EXPECT_EQ(rows[0][13], "type_v");
  EXPECT_EQ(rows[0][14], "main_gpu");
  const char* want[] = {"f32", "f32", "f16", "f16"};
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_EQ(rows[i + 1].size(), 15u) << r.out;
    EXPECT_EQ(rows[i + 1][14], "0") << r.out;
    EXPECT_EQ(rows[i + 1][12], want[i]) << r.out;
    EXPECT_EQ(rows[i + 1][13], want[i]) << r.out;
    EXPECT_GT(std::stod(rows[i + 1][8]), 0.0) << r.out;
  }
  const CliResult md = run_bonsai("bench" + m() + "-p 0 -n 2 -r 1 -ctk f16 -ctv f16");
  ASSERT_EQ(md.rc, 0) << md.err;
  EXPECT_NE(md.out.find("| type_k | type_v |"), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("| f16 | f16 |"), std::string::npos) << md.out;
  const CliResult plain = run_bonsai("bench" + m() + "-p 0 -n 2 -r 1");
  ASSERT_EQ(plain.rc, 0) << plain.err;
  EXPECT_EQ(plain.out.find("type_k"), std::string::npos) << plain.out;
  for (const std::string bad : {"-ctk f16 -ctv f32", "-ctk q8_0", "-ctk f32,f16 -ctv f16"}) {
    const CliResult e = run_bonsai("bench" + m() + "-p 0 -n 2 -r 1 " + bad);
    EXPECT_EQ(e.rc, 2) << bad << "\n" << e.err;
    EXPECT_NE(e.err.find("-ctk/--cache-type-k"), std::string::npos) << bad << "\n" << e.err;
    EXPECT_TRUE(e.out.empty()) << e.out;
  }
}

TEST_F(BenchCli, BackendChoiceIsTheDefaultChunk) {
  // Without -ub the md table has no n_ubatch column; pp rows report the backend's chunk in csv (64 on the
  // CPU).
  const CliResult md = run_bonsai("bench" + m() + "-p 3 -n 0 -r 1");
  ASSERT_EQ(md.rc, 0) << md.err;
  EXPECT_EQ(md.out.find("n_ubatch"), std::string::npos) << md.out;
  const CliResult csv = run_bonsai("bench" + m() + "-p 3 -n 0 -r 1 -o csv");
  ASSERT_EQ(csv.rc, 0) << csv.err;
  const auto rows = csv_rows(csv.out);
  ASSERT_EQ(rows.size(), 2u) << csv.out;
  EXPECT_EQ(rows[1][5], "64");
}

// -mg is the run's parameter (the last csv column, json "main_gpu"); the CPU paths ignore it.
TEST_F(BenchCli, MainGpuIsReportedAndIgnoredOnTheCpu) {
  const CliResult r = run_bonsai("bench" + m() + "-p 0 -n 2 -r 1 -mg 3 -o csv");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto rows = csv_rows(r.out);
  ASSERT_EQ(rows.size(), 2u) << r.out;
  ASSERT_EQ(rows[1].size(), 15u) << r.out;
  EXPECT_EQ(rows[1][14], "3") << r.out;
  EXPECT_EQ(rows[1][3].find("cuda"), std::string::npos) << r.out;
  const CliResult j = run_bonsai("bench" + m() + "-p 0 -n 2 -r 1 --main-gpu 2 -o json");
  ASSERT_EQ(j.rc, 0) << j.err;
  EXPECT_NE(j.out.find("\"main_gpu\": 2"), std::string::npos) << j.out;
}

TEST_F(BenchCli, BadUbatchIsAUsageError) {
  for (const std::string v : {"-1", "5000"}) {
    const CliResult r = run_bonsai("bench" + m() + "-p 4 -n 0 -r 1 -ub " + v);
    EXPECT_EQ(r.rc, 2) << v << "\n" << r.err;
    EXPECT_NE(r.err.find("-ub/--ubatch-size"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("[1, 4096]"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

TEST_F(BenchCli, DepthRunsEveryTestAfterItsContext) {
  const CliResult r = run_bonsai("bench" + m() + "-p 3 -n 2 -d 0,5 -r 1 -o csv");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto rows = csv_rows(r.out);
  ASSERT_EQ(rows.size(), 5u) << r.out;  // header; pp3 and tg2 at depth 0, then both at depth 5
  ASSERT_GE(rows[0].size(), 8u);
  EXPECT_EQ(rows[0][6], "test");
  EXPECT_EQ(rows[0][7], "n_depth");
  const std::vector<std::pair<std::string, std::string>> want{
      {"pp3", "0"}, {"tg2", "0"}, {"pp3", "5"}, {"tg2", "5"}};
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_GE(rows[i + 1].size(), 8u) << r.out;
    EXPECT_EQ(rows[i + 1][6], want[i].first) << r.out;
    EXPECT_EQ(rows[i + 1][7], want[i].second) << r.out;
  }
  // llama-bench's markdown label; the profiled steps after a context count the same calls per token as
  // without one (the context's prefill is not in the breakdown).
  const CliResult md = run_bonsai("bench" + m() + "-p 0 -n 2 -d 0,5 -r 1 --profile");
  ASSERT_EQ(md.rc, 0) << md.err;
  EXPECT_NE(md.out.find("| tg2 @ d5 |"), std::string::npos) << md.out;
  const size_t at0 = md.out.find("tg2; profiled run"), at5 = md.out.find("tg2 @ d5; profiled run");
  ASSERT_NE(at0, std::string::npos) << md.out;
  ASSERT_NE(at5, std::string::npos) << md.out;
  auto calls = [&](size_t from, size_t to) {  // "| op | calls/token |" of one breakdown, in order
    std::vector<std::pair<std::string, std::string>> v;
    std::istringstream in(md.out.substr(from, to - from));
    for (std::string line; std::getline(in, line);) {
      std::vector<std::string> c;
      std::istringstream l(line);
      for (std::string x; std::getline(l, x, '|');) c.push_back(x);
      if (c.size() >= 3 && line.rfind("| ", 0) == 0 && c[1] != " op " &&
          c[1].find("---") == std::string::npos)
        v.emplace_back(c[1], c[2]);
    }
    std::sort(v.begin(), v.end());
    return v;
  };
  const auto c0 = calls(at0, at5), c5 = calls(at5, md.out.size());
  EXPECT_GT(c0.size(), 5u) << md.out;
  EXPECT_EQ(c0, c5) << md.out;
}

TEST_F(BenchCli, DepthIsCheckedAgainstItsRangeAndTheTrainedContext) {
  // The tiny preset's trained context is 4096 positions: a depth of 4094 and 2 steps fit exactly.
  const CliResult fits = run_bonsai("bench" + m() + "-p 0 -n 2 -d 4094 -r 1 -o csv");
  ASSERT_EQ(fits.rc, 0) << fits.err;
  const CliResult over = run_bonsai("bench" + m() + "-p 0 -n 2 -d 4095 -r 1");
  EXPECT_EQ(over.rc, 2) << over.err;
  EXPECT_NE(over.err.find("-d/--n-depth 4095"), std::string::npos) << over.err;
  EXPECT_NE(over.err.find("trained context (4096)"), std::string::npos) << over.err;
  EXPECT_TRUE(over.out.empty()) << over.out;
  for (const std::string v : {"-1", "2000000"}) {
    const CliResult r = run_bonsai("bench" + m() + "-p 0 -n 1 -r 1 -d " + v);
    EXPECT_EQ(r.rc, 2) << v << "\n" << r.err;
    EXPECT_NE(r.err.find("-d/--n-depth"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("[0, 1048576]"), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace bonsai
