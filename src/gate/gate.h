// Token-parity gate against `bonsai-parity/1` fixtures (SPEC §5).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "bonsai/kv_type.h"

namespace bonsai {

enum class GateCriteria {
  Strict,  // reference path: argmax identical everywhere, max|Δ| <= 2e-4·max(1, max|ref|), continuation
           // identical
  Fast,    // fast paths: cosine >= 0.999 everywhere, argmax identical where ref margin >= 0.1,
           // continuation identical up to the first step whose ref margin < 0.1
};

struct GateOptions {
  std::string manifest;
  std::vector<std::string> cases;  // empty = all; otherwise exact names or names containing the string
  std::string path = "ref";        // compute path (Session path)
  GateCriteria criteria = GateCriteria::Strict;
  int n_threads = 0;
  int main_gpu = 0;               // CUDA device of the cuda and auto paths (-mg)
  bool prefill = false;           // prompt positions via Session::prefill
  std::optional<KvType> kv_type;  // KV cache element type (-ctk / -ctv); none: the backend's default
  std::string dump_logits_dir;    // teacher-forced logits per case, fixture format
  std::string dump_activations_dir;
  std::function<void(const std::string&)> on_case_start;
};

struct GateCaseResult {
  std::string name, model;
  int positions = 0;
  int argmax_agree = 0;
  int low_margin_rows = 0;              // rows whose reference top-1/top-2 margin < 0.05
  int argmax_disagree_high_margin = 0;  // disagreements where the reference margin >= 0.1
  double max_abs_diff = 0, max_abs_ref = 0, min_cosine = 1, min_margin = 0;
  int continuation_len = 0, continuation_match = 0;  // greedy free-run tokens matching, before the first miss
  int continuation_required = 0;                     // tokens that must match under the criteria
  double prefill_vs_walk = -1;  // --prefill: max |Δlogit| between prefill and a token walk of the prompt
  double seconds = 0;
  KvType kv_type = KvType::F32;  // the sessions' cache type (GateOptions::kv_type, or the backend's default)
  bool pass = false;
  std::string why;  // first failed criterion
};

// Runs every selected case. Throws bonsai::Error on malformed fixtures.
std::vector<GateCaseResult> run_gate(const GateOptions& o);

}  // namespace bonsai
