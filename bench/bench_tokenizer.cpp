// Tokenizer throughput on 1 MB of mixed text with the real Qwen3 vocabulary
// of the tokenizer fixtures (BONSAI_TOKENIZER_VOCAB overrides the path).
//   build/<dir>/bench/bonsai_bench --benchmark_filter=Tokenizer
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <optional>

#include "bonsai/gguf.h"
#include "bonsai/tokenizer.h"
#include "tests/text_corpus.h"

namespace {

std::string vocab_path() {
  if (const char* p = std::getenv("BONSAI_TOKENIZER_VOCAB")) return p;
  return (std::filesystem::path(__FILE__).parent_path() / "../../shared/fixtures/tokenizer/qwen3-vocab.gguf")
      .lexically_normal()
      .string();
}

// Built once and never modified (a constant, not shared mutable state).
struct Fixture {
  std::string path = vocab_path();
  bool ok = std::filesystem::exists(path);
  std::optional<bonsai::GgufFile> file;
  std::unique_ptr<bonsai::Tokenizer> tok;
  std::string text;
  std::vector<int32_t> ids;
  Fixture() {
    if (!ok) return;
    file.emplace(bonsai::GgufFile::open(path));
    tok = bonsai::Tokenizer::from_gguf(*file);
    for (const auto& p : bonsai::testing::mixed_paragraphs(1 << 20)) text += p;
    ids = tok->encode(text, true);
  }
};

const Fixture* fixture(benchmark::State& state) {
  static const Fixture f;
  if (!f.ok) {
    state.SkipWithError(("vocabulary not found: " + f.path).c_str());
    return nullptr;
  }
  return &f;
}

void BM_TokenizerEncode1MB(benchmark::State& state) {
  const Fixture* f = fixture(state);
  if (!f) return;
  size_t n = 0;
  for (auto _ : state) {
    auto ids = f->tok->encode(f->text, true);
    n = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f->text.size()));
  state.counters["tokens"] = static_cast<double>(n);
}
BENCHMARK(BM_TokenizerEncode1MB)->Unit(benchmark::kMillisecond);

void BM_TokenizerDecode1MB(benchmark::State& state) {
  const Fixture* f = fixture(state);
  if (!f) return;
  for (auto _ : state) {
    auto text = f->tok->decode(f->ids);
    benchmark::DoNotOptimize(text.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f->text.size()));
}
BENCHMARK(BM_TokenizerDecode1MB)->Unit(benchmark::kMillisecond);

void BM_TokenizerLoad(benchmark::State& state) {
  if (!std::filesystem::exists(vocab_path())) {
    state.SkipWithError("vocabulary not found");
    return;
  }
  bonsai::GgufFile file = bonsai::GgufFile::open(vocab_path());
  for (auto _ : state) {
    auto tok = bonsai::Tokenizer::from_gguf(file);
    benchmark::DoNotOptimize(tok.get());
  }
}
BENCHMARK(BM_TokenizerLoad)->Unit(benchmark::kMillisecond);

}  // namespace
