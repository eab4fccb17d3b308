// The reference forward pass on the fixture models: named activations against
// the reference dump, and refusal of corrupted Hadamard metadata.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "bonsai/error.h"
#include "bonsai/gguf_writer.h"
#include "bonsai/model.h"
#include "bonsai/session.h"
#include "temp_path.h"

namespace bonsai {
namespace {

namespace fs = std::filesystem;
const fs::path kFixtures = BONSAI_FIXTURES_DIR;

#define REQUIRE_FIXTURES() \
  if (!fs::exists(kFixtures / "manifest.json")) GTEST_SKIP() << "no fixtures at " << kFixtures

std::vector<float> read_f32(const fs::path& p) {
  std::ifstream in(p, std::ios::binary | std::ios::ate);
  std::vector<float> v(static_cast<size_t>(in.tellg()) / 4);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

TEST(ReferenceModel, NamedActivationsMatchReferenceDump) {
  REQUIRE_FIXTURES();
  const fs::path dump = kFixtures / "dumps/tiny-b128-greedy";
  nlohmann::json index;
  std::ifstream(dump / "index.json") >> index;
  auto model = Model::load((kFixtures / "tiny-b128/model.pq2_0.gguf").string());
  const fs::path out = bonsai::testing::unique_temp_path("dump_test");
  fs::remove_all(out);
  SessionOptions so;
  so.n_ctx = 16;
  so.dump_dir = out.string();
  Session s(*model, so);
  for (int tok : index["tokens"]) s.decode(tok);
  int compared = 0;
  for (int pos = 0; pos < 3; ++pos) {
    for (auto& [name, ne] : index["tensors"].items()) {
      const fs::path ours = out / ("pos" + std::to_string(pos)) / (name + ".f32");
      if (!fs::exists(ours)) continue;  // e.g. a_softplus is internal to our gdn_gates op
      auto a = read_f32(ours), b = read_f32(dump / ("pos" + std::to_string(pos)) / (name + ".f32"));
      ASSERT_EQ(a.size(), b.size()) << name;
      double mx = 0, d = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        mx = std::max(mx, std::fabs(static_cast<double>(b[i])));
        d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
      }
      // F32 evaluation-order noise of the reference is ~1e-5 relative (fixtures' notes.txt);
      // 1e-4 leaves room for accumulation over 4 layers and fails on any real divergence.
      EXPECT_LE(d, 1e-4 * std::max(1.0, mx)) << name << " at pos " << pos;
      ++compared;
    }
  }
  EXPECT_GE(compared, 3 * 50) << "too few named activations matched the reference's names";
  fs::remove_all(out);
}

// Copies a fixture model, letting `edit` change metadata; returns the new path.
fs::path rewrite(const fs::path& src, const std::string& tag,
                 const std::function<bool(const std::string&, const GgufValue&, GgufWriter&)>& edit) {
  GgufFile f = GgufFile::open(src.string());
  GgufWriter w(f.version());
  for (const auto& [k, v] : f.metadata())
    if (!edit(k, v, w)) w.add_value(k, v);
  for (const auto& t : f.tensors())
    w.add_tensor_bytes(t.name, t.ggml_type, t.ne, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  fs::path out = bonsai::testing::unique_temp_path("corrupt_" + tag + ".gguf");
  w.write_file(out.string());
  return out;
}

std::string load_error(const fs::path& p) {
  try {
    Model::load(p.string());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ReferenceModel, CorruptedHadamardMetadataIsRefused) {
  REQUIRE_FIXTURES();
  const fs::path src = kFixtures / "tiny-b128/model.pq2_0.gguf";
  struct Corruption {
    const char* tag;
    const char* key_in_message;
    std::function<bool(const std::string&, const GgufValue&, GgufWriter&)> edit;
  };
  std::vector<Corruption> cases = {
      {"zero_sign", "prism.hadamard.sign_values",
       [](const std::string& k, const GgufValue& v, GgufWriter& w) {
         if (k != "prism.hadamard.sign_values") return false;
         std::vector<int32_t> s(v.count);
         for (uint64_t i = 0; i < v.count; ++i) s[i] = static_cast<int32_t>(v.elem_i64(i));
         s[17] = 0;
         w.add_array_i32(k, s);
         return true;
       }},
      {"missing_weight_name", "prism.hadamard.weight_names",
       [](const std::string& k, const GgufValue& v, GgufWriter& w) {
         if (k != "prism.hadamard.weight_names") return false;
         std::vector<std::string> names;
         for (auto s : v.strings)
           if (s != "blk.1.ffn_up.weight") names.emplace_back(s);
         w.add_array_strings(k, names);
         return true;
       }},
      {"unknown_weight_name", "prism.hadamard.weight_names",
       [](const std::string& k, const GgufValue& v, GgufWriter& w) {
         if (k != "prism.hadamard.weight_names") return false;
         std::vector<std::string> names(v.strings.begin(), v.strings.end());
         names.push_back("blk.9.ffn_up.weight");
         w.add_array_strings(k, names);
         return true;
       }},
      {"bad_block", "prism.hadamard.block_size",
       [](const std::string& k, const GgufValue&, GgufWriter& w) {
         if (k != "prism.hadamard.block_size") return false;
         w.add_u32(k, 96);
         return true;
       }},
      {"block_not_dividing", "prism.hadamard.block_size",
       [](const std::string& k, const GgufValue&, GgufWriter& w) {
         if (k != "prism.hadamard.block_size") return false;
         w.add_u32(k, 1024);
         return true;
       }},
      {"bad_transform", "prism.hadamard.transform",
       [](const std::string& k, const GgufValue&, GgufWriter& w) {
         if (k != "prism.hadamard.transform") return false;
         w.add_string(k, "dct");
         return true;
       }},
      {"missing_width", "prism.hadamard.sign_",
       [](const std::string& k, const GgufValue&, GgufWriter& w) {
         if (k == "prism.hadamard.sign_widths") {
           w.add_array_i32(k, std::vector<int32_t>{256});
           return true;
         }
         if (k == "prism.hadamard.sign_values") {
           w.add_array_i32(k, std::vector<int32_t>(256, 1));
           return true;
         }
         return false;
       }},
      {"inverse_extra", "prism.hadamard.inverse_weight_names",
       [](const std::string& k, const GgufValue&, GgufWriter& w) {
         if (k != "prism.hadamard.inverse_weight_names") return false;
         w.add_array_strings(k, {"token_embd.weight", "output.weight"});
         return true;
       }},
      {"missing_grouped", "prism.hadamard.gdn_v_grouped",
       [](const std::string& k, const GgufValue&, GgufWriter&) {
         return k == "prism.hadamard.gdn_v_grouped";
       }},
      {"bad_version", "prism.hadamard.version",
       [](const std::string& k, const GgufValue&, GgufWriter& w) {
         if (k != "prism.hadamard.version") return false;
         w.add_u32(k, 3);
         return true;
       }},
      {"no_prism_keys", "prism.hadamard",
       [](const std::string& k, const GgufValue&, GgufWriter&) {
         return k.rfind("prism.hadamard.", 0) == 0;
       }},
  };
  for (const auto& c : cases) {
    fs::path p = rewrite(src, c.tag, c.edit);
    std::string msg = load_error(p);
    EXPECT_NE(msg.find(c.key_in_message), std::string::npos) << c.tag << ": " << msg;
    EXPECT_NE(msg.find(p.string()), std::string::npos) << c.tag << ": message must name the file: " << msg;
    fs::remove(p);
  }
  // The unmodified copy loads (so the failures above are caused by the edits).
  fs::path same =
      rewrite(src, "same", [](const std::string&, const GgufValue&, GgufWriter&) { return false; });
  EXPECT_EQ(load_error(same), "");
  fs::remove(same);
}

TEST(ReferenceModel, TiedHeadNeedsVersion2) {
  REQUIRE_FIXTURES();
  fs::path p = rewrite(kFixtures / "tiny-tied/model.pq2_0.gguf", "tied_v1",
                       [](const std::string& k, const GgufValue&, GgufWriter& w) {
                         if (k == "prism.hadamard.tied_output") return true;  // drop it
                         if (k != "prism.hadamard.version") return false;
                         w.add_u32(k, 1);
                         return true;
                       });
  std::string msg = load_error(p);
  EXPECT_NE(msg.find("tied_output"), std::string::npos) << msg;
  fs::remove(p);
}

TEST(ReferenceModel, ContextLimitIsEnforced) {
  REQUIRE_FIXTURES();
  auto model = Model::load((kFixtures / "tiny-b128/model.pq2_0.gguf").string());
  SessionOptions so;
  so.n_ctx = 4;
  Session s(*model, so);
  for (int i = 0; i < 4; ++i) s.decode(i);
  EXPECT_THROW(s.decode(5), Error);
  EXPECT_THROW(s.decode(-1), Error);
  s.reset();
  EXPECT_THROW(s.decode(512), Error);  // vocab 512
  EXPECT_NO_THROW(s.decode(511));
}

TEST(ReferenceModel, SnapshotRestoreReproducesLogits) {
  REQUIRE_FIXTURES();
  auto model = Model::load((kFixtures / "tiny-b128/model.pq2_0.gguf").string());
  SessionOptions so;
  so.n_ctx = 16;
  Session s(*model, so);
  s.decode(1);
  s.decode(2);
  auto snap = s.snapshot();
  auto a = std::vector<float>(s.decode(3).begin(), s.decode(3).end());
  s.restore(*snap);
  EXPECT_EQ(s.position(), 2);
  auto b = std::vector<float>(s.decode(3).begin(), s.decode(3).end());
  EXPECT_EQ(a, b);
}

// An f16 KV cache (-ctk f16 -ctv f16) on both paths: a token walk and a batched prefill read the same
// rounded rows (within the f32 cache's prefill-vs-walk bounds), the snapshot carries the halves (restore
// reproduces the logits exactly), and the logits stay within the rounding's reach of the f32 cache's. Why
// 0.9999: each cached element moves by at most 2^-11 of itself; carried through scores, softmax and the
// layers that is a relative error of the order of 10·2^-11 ≈ 5e-3 in a logit row, and 1 - cos ≈ ½·(relative
// error)² ≈ 1.2e-5.
TEST(ReferenceModel, F16CacheWalkPrefillSnapshotAndDistanceToF32) {
  REQUIRE_FIXTURES();
  auto model = Model::load((kFixtures / "tiny-b128/model.pq2_0.gguf").string());
  const std::vector<int32_t> prompt = {5, 9, 200, 17, 3, 88, 401, 12, 7, 300, 1};
  const size_t V = 512;
  for (const char* path : {"ref", "fast"}) {
    SessionOptions so;
    so.n_ctx = 32;
    so.path = path;
    Session f32(*model, so);
    EXPECT_EQ(f32.kv_type(), KvType::F32) << path;  // unset: the backend's default, f32 on ref and fast
    so.kv_type = KvType::F16;
    Session walk(*model, so);
    EXPECT_EQ(walk.kv_type(), KvType::F16);
    EXPECT_EQ(2 * walk.kv_cache_bytes(), f32.kv_cache_bytes());
    EXPECT_GT(walk.kv_cache_bytes(), 0u);
    std::vector<float> walk_rows;
    for (int32_t t : prompt) {
      auto l = walk.decode(t);
      walk_rows.insert(walk_rows.end(), l.begin(), l.end());
      auto r = f32.decode(t);
      double dot = 0, na = 0, nb = 0;
      for (size_t i = 0; i < V; ++i) {
        dot += double(l[i]) * r[i];
        na += double(l[i]) * l[i];
        nb += double(r[i]) * r[i];
      }
      EXPECT_GE(dot / std::sqrt(na * nb), 0.9999) << path;
    }
    so.prefill_chunk = 4;
    Session batched(*model, so);
    std::vector<float> rows(prompt.size() * V);
    batched.prefill(prompt, rows);
    double d = 0, mx = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      d = std::max(d, std::fabs(double(rows[i]) - walk_rows[i]));
      mx = std::max(mx, std::fabs(double(walk_rows[i])));
    }
    // the bounds of PrefillMatchesTokenWalk (below): both read the same halves
    EXPECT_LE(d, (std::string(path) == "ref" ? 1e-6 : 2.8e-3) * std::max(1.0, mx)) << path;
    auto snap = walk.snapshot();
    auto a = std::vector<float>(walk.decode(3).begin(), walk.decode(3).end());
    walk.restore(*snap);
    auto b = std::vector<float>(walk.decode(3).begin(), walk.decode(3).end());
    EXPECT_EQ(a, b) << path;
  }
}

// Batched prefill (chunks crossing boundaries) leaves exactly the state of a
// token walk: same logits for every prompt row and for the decode after it.
TEST(ReferenceModel, PrefillMatchesTokenWalk) {
  REQUIRE_FIXTURES();
  auto model = Model::load((kFixtures / "tiny-b128/model.pq2_0.gguf").string());
  const std::vector<int32_t> prompt = {5, 9, 200, 17, 3, 88, 401, 12, 7, 300, 1};
  for (const char* path : {"ref", "fast"}) {
    SessionOptions so;
    so.n_ctx = 32;
    so.path = path;
    Session walk(*model, so);
    std::vector<float> walk_rows;
    for (int32_t t : prompt) {
      auto l = walk.decode(t);
      walk_rows.insert(walk_rows.end(), l.begin(), l.end());
    }
    so.prefill_chunk = 4;  // 11 tokens: chunks of 4, 4, 3
    Session batched(*model, so);
    std::vector<float> rows(prompt.size() * 512);
    batched.prefill(prompt, rows);
    EXPECT_EQ(batched.position(), walk.position());
    double d = 0, mx = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      d = std::max(d, std::fabs(double(rows[i]) - walk_rows[i]));
      mx = std::max(mx, std::fabs(double(walk_rows[i])));
    }
    // ref: every op computes row i of a batch with the same per-row arithmetic
    // as a batch of one (threads only split rows), so the results agree to
    // rounding. fast: batched matmuls run the GEMM (kernels/cpu/gemm.h), whose
    // integers equal the matvec's but whose float sum over blocks is ordered
    // differently; the ~1-ulp differences re-round some quantized activations
    // of the next layer, so the two walks differ by the faithful path's own
    // noise: its max |Δlogit| vs the reference is ≤ 1.4e-3 on the fixtures
    // (docs/performance.md), hence a bound of 2 × 1.4e-3 relative to the
    // largest logit (a broken batch moves logits by O(1)).
    const double tol = (std::string(path) == "ref" ? 1e-6 : 2.8e-3) * std::max(1.0, mx);
    EXPECT_LE(d, tol) << path;
    auto a = walk.decode(42);
    std::vector<float> av(a.begin(), a.end());
    auto b = batched.decode(42);
    for (size_t i = 0; i < av.size(); ++i) ASSERT_NEAR(av[i], b[i], tol) << path;
  }
}

}  // namespace
}  // namespace bonsai
