// The qwen35 forward pass, written once against the op-level Backend
// interface. It reads top to bottom in the order of the architecture
// (SPEC §4); every intermediate has a name (llama.cpp's graph names where one
// exists) so a debug dump can be diffed against the reference.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "bonsai/model.h"
#include "kernels/backend.h"
#include "model/weights.h"

namespace bonsai {

// Per-sequence state living in backend memory.
struct GraphState {
  int n_ctx = 0;
  KvType kv = KvType::F32;  // element type of k_cache / v_cache
  // attention layers: [n_ctx][Hkv·D] elements of type kv (an F16 cache packs two per float slot;
  // nullptr for GDN layers)
  std::vector<float*> k_cache, v_cache;
  std::vector<float*> conv_state, ssm_state;  // GDN layers: [(taps-1)][C] and [n_v][d_k][d_v]
};

class Graph {
 public:
  Graph(const Model& model, Backend& backend, int n_ctx, KvType kv = KvType::F32);
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Runs t tokens at positions pos0..pos0+t-1 and writes logits to host memory:
  // all t rows ([t][n_vocab]) when all_logits, else only the last row; none
  // (the head is skipped) when logits_host is nullptr.
  void forward(const int32_t* tokens, int t, int pos0, float* logits_host, bool all_logits);
  // Runs one token like forward() but brings only the k best of the first n logits to the
  // host (Backend::top_k: ids[k], values[k], best first). The full row stays in backend
  // memory until the next forward: logits_to_host() copies it.
  void forward_top_k(int32_t token, int pos0, int k, int64_t n, int32_t* ids, float* values);
  void logits_to_host(float* host);  // [n_vocab]: the head's first row of the last forward
  void reset_state();
  GraphState& state() { return state_; }
  const GraphState& state() const { return state_; }
  uint64_t kv_cache_bytes() const;  // every attention layer's K and V buffers
  // Copies of the state for snapshot/restore (host memory).
  std::vector<float> save_state(int n_pos) const;
  void load_state(const std::vector<float>& s, int n_pos);

  void set_dump_dir(std::string dir) { dump_dir_ = std::move(dir); }

 private:
  struct Scratch;
  void ensure_scratch(int t);
  // The layers and, when `head`, the head (rows first..t-1) into the backend's logits buffer.
  void compute(const int32_t* tokens, int t, int pos0, bool head, int first);
  // The ops of forward(): the layers, then the head (rows first..t-1) when `head`.
  void forward_ops(const int32_t* tokens, int t, int pos0, bool head, int first);
  // Float slots of `rows` KV-cache rows of one layer (Hkv·D elements of type state_.kv each).
  size_t kv_floats(int64_t rows) const;
  void name(const char* what, int layer, const float* p, int64_t width, int t, int pos0);
  void hadamard_site(const float* x, float* y, int64_t k, int t);
  const float* signs_for(int64_t k) const;  // backend buffer of the width-k signs, or nullptr
  void gdn_layer(int il, int t, int pos0);
  void attention_layer(int il, int t, int pos0);
  void attention_ops(int il, int t, int pos0, const AttentionShape& as);
  void ffn(int il, int t, int pos0);

  const Model& model_;
  const ModelConfig& c_;
  Backend& be_;
  ModelWeights w_;     // copies of the bound weights (the backend may attach prepared data)
  int64_t block_ = 0;  // Hadamard block (0: unrotated model)
  bool permute_ssm_out_ = false;
  std::vector<std::pair<int64_t, float*>> signs_;  // width -> backend buffer (nullptr: identity)
  GraphState state_;
  std::unique_ptr<Scratch> s_;
  int capacity_ = 0;
  std::string dump_dir_;
};

}  // namespace bonsai
