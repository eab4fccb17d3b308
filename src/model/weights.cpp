#include "model/weights.h"

#include <unordered_map>

#include "bonsai/config.h"
#include "bonsai/error.h"
#include "bonsai/gguf.h"

namespace bonsai {
namespace {

bool allowed(TensorRole role, DType t) {
  switch (role) {
    case TensorRole::Folded:
    case TensorRole::Embedding:
      return t == DType::PQ2_0 || t == DType::PTQ1_0 || t == DType::Q2_0_G128 || t == DType::Q2_0_G64 ||
             t == DType::Q1_0 || t == DType::Q8_0 || t == DType::F16 || t == DType::BF16 || t == DType::F32;
    case TensorRole::SsmAB:
      return t == DType::BF16 || t == DType::F16 || t == DType::F32;
    case TensorRole::Norm:
    case TensorRole::SsmParam:
      return t == DType::F32 || t == DType::F16 || t == DType::BF16;
  }
  return false;
}

const char* allowed_list(TensorRole role) {
  switch (role) {
    case TensorRole::Folded:
    case TensorRole::Embedding:
      return "PQ2_0, PTQ1_0, Q2_0, Q1_0, Q8_0, F16, BF16, F32";
    case TensorRole::SsmAB:
      return "BF16, F16, F32";
    default:
      return "F32, F16, BF16";
  }
}

}  // namespace

std::unique_ptr<ModelWeights> ModelWeights::bind(const GgufFile& f, const ModelConfig& c) {
  auto mw = std::make_unique<ModelWeights>();
  std::unordered_map<std::string, Weight> bound;
  for (const TensorSpec& s : tensor_inventory(c)) {
    const GgufTensor& t = f.tensor(s.name);
    std::vector<uint64_t> ne = t.ne;
    while (ne.size() > s.ne.size() && ne.back() == 1) ne.pop_back();
    if (ne != s.ne) {
      GgufTensor expect;
      expect.ne = s.ne;
      fail("{}: tensor '{}' has shape {}, expected {} from the qwen35 hyperparameters", f.path(), s.name,
           t.shape_str(), expect.shape_str());
    }
    if (!allowed(s.role, t.dtype))
      fail("{}: tensor '{}' has type {}, expected one of: {}", f.path(), s.name,
           t.dtype == DType::Other ? type_info(t.ggml_type)->name : dtype_info(t.dtype).name,
           allowed_list(s.role));
    Weight w;
    w.name = s.name;
    w.type = t.dtype;
    w.k = static_cast<int64_t>(s.ne[0]);
    w.n = s.ne.size() > 1 ? static_cast<int64_t>(s.ne[1]) : 1;
    w.data = t.data;
    w.nbytes = t.nbytes;
    // Vector parameters are consumed as F32 by every op; convert the rare F16/BF16 ones once.
    bool is_param = s.role == TensorRole::Norm || s.role == TensorRole::SsmParam;
    if (is_param && t.dtype != DType::F32) {
      auto buf = std::make_unique<float[]>(t.nelements);
      dequantize_row(t.dtype, t.data, buf.get(), static_cast<int64_t>(t.nelements));
      w.type = DType::F32;
      w.data = reinterpret_cast<const uint8_t*>(buf.get());
      w.nbytes = t.nelements * sizeof(float);
      mw->owned.push_back(std::move(buf));
    }
    bound.emplace(s.name, std::move(w));
  }
  auto take = [&](const std::string& name) { return bound.at(name); };
  mw->tok_embd = take("token_embd.weight");
  mw->output_norm = take("output_norm.weight");
  mw->output = c.tied_output ? mw->tok_embd : take("output.weight");
  mw->layers.resize(c.n_layer);
  for (uint32_t il = 0; il < c.n_layer; ++il) {
    LayerWeights& L = mw->layers[il];
    auto n = [&](const char* s) { return take("blk." + std::to_string(il) + "." + s); };
    L.recurrent = c.recurrent[il] != 0;
    L.attn_norm = n("attn_norm.weight");
    L.post_norm = n("post_attention_norm.weight");
    L.ffn_gate = n("ffn_gate.weight");
    L.ffn_up = n("ffn_up.weight");
    L.ffn_down = n("ffn_down.weight");
    if (L.recurrent) {
      L.ssm_qkv = n("attn_qkv.weight");
      L.ssm_z = n("attn_gate.weight");
      L.ssm_conv1d = n("ssm_conv1d.weight");
      L.ssm_dt_bias = n("ssm_dt.bias");
      L.ssm_a = n("ssm_a");
      L.ssm_alpha = n("ssm_alpha.weight");
      L.ssm_beta = n("ssm_beta.weight");
      L.ssm_norm = n("ssm_norm.weight");
      L.ssm_out = n("ssm_out.weight");
    } else {
      L.attn_q = n("attn_q.weight");
      L.attn_k = n("attn_k.weight");
      L.attn_v = n("attn_v.weight");
      L.attn_out = n("attn_output.weight");
      L.attn_q_norm = n("attn_q_norm.weight");
      L.attn_k_norm = n("attn_k_norm.weight");
    }
  }
  return mw;
}

}  // namespace bonsai
