// `bonsai bench` end to end on a synthesized tiny model: the llama-bench-shaped
// rows (csv), the -ub/--ubatch-size list (each value runs the pp tests with that
// prefill chunk, the tg tests run once) and the refusal of bad values.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
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

TEST_F(BenchCli, BadUbatchIsAUsageError) {
  for (const std::string v : {"-1", "5000"}) {
    const CliResult r = run_bonsai("bench" + m() + "-p 4 -n 0 -r 1 -ub " + v);
    EXPECT_EQ(r.rc, 2) << v << "\n" << r.err;
    EXPECT_NE(r.err.find("-ub/--ubatch-size"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("[1, 4096]"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

}  // namespace
}  // namespace bonsai
