// Hugging Face LlamaForCausalLM folder from an mllm llama checkpoint (see hf_export.h).
#include "mllm/train/hf_export.h"

#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "mllm/core/error.h"
#include "mllm/core/recipe.h"
#include "mllm/core/special_tokens.h"
#include "mllm/data/atomic_file.h"
#include "mllm/data/bpe_tokenizer.h"
#include "mllm/data/tokenizer.h"
#include "mllm/model/llama.h"
#include "mllm/model/model.h"
#include "mllm/train/checkpoint.h"

namespace mllm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

// Rows of a q or k projection [heads * head_dim, d] from Meta's rotary layout (pairs (2i, 2i+1)
// of each head rotate together) to transformers' (i, i + head_dim / 2):
// w.view(heads, head_dim / 2, 2, d).transpose(1, 2).reshape(heads * head_dim, d),
// the `permute` of transformers' convert_llama_weights_to_hf.py.
torch::Tensor to_rotate_half(const torch::Tensor& w, int64_t heads) {
  const int64_t rows = w.size(0), d = w.size(1), head_dim = rows / heads;
  return w.view({heads, head_dim / 2, 2, d}).transpose(1, 2).reshape({rows, d});
}

void write_text(const fs::path& path, const std::string& text) {
  AtomicFile f(path.string());
  f.write(text);
  f.commit();
}

// tokenizers' tokenizer.json for the char tokenizer: a WordLevel vocabulary of single
// characters, each character its own pre-token (Split on any one code point), BOS prepended.
json char_tokenizer_json(const Tokenizer& tok) {
  json vocab = json::object();
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    const std::string piece = id < kNumSpecialIds ? std::string(kSpecialPieces[id]) : tok.token_bytes(id);
    vocab[piece] = id;
  }
  json added = json::array();
  for (int32_t id = 0; id < kNumSpecialIds; ++id)
    added.push_back({{"id", id}, {"content", kSpecialPieces[id]}, {"single_word", false},
                     {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", true}});
  const std::string bos = kSpecialPieces[kBosId];
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "[\\s\\S]"}}},
                             {"behavior", "Isolated"}, {"invert", false}}},
          {"post_processor", {{"type", "TemplateProcessing"},
                              {"single", json::array({{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                                                      {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                              {"pair", json::array({{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                                                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                                    {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
                              {"special_tokens", {{bos, {{"id", bos}, {"ids", {kBosId}}, {"tokens", {bos}}}}}}}},
          {"decoder", {{"type", "Fuse"}}},
          {"model", {{"type", "WordLevel"}, {"vocab", vocab}, {"unk_token", kSpecialPieces[kUnkId]}}}};
}

}  // namespace

std::vector<std::string> export_hf(const std::string& checkpoint_folder, const std::string& out_dir,
                                   const std::string& dtype) {
  if (dtype != "fp32" && dtype != "bf16")
    throw ConfigError(fmt::format("--dtype {}: expected fp32 or bf16", dtype));
  const auto [folder, recipe] = open_checkpoint(checkpoint_folder);
  if (recipe.model.type != "llama")
    throw ConfigError(fmt::format(
        "model.type {} has no standard Hugging Face architecture to export to (only llama maps to "
        "LlamaForCausalLM); its weights stay available, with mllm's names, in {}/model.safetensors",
        recipe.model.type, folder));
  auto tokenizer = load_tokenizer(checkpoint_tokenizer_path(folder));
  const LlamaOptions o = LlamaOptions::from_config(recipe.model, tokenizer->vocab_size(),
                                                   recipe.max_seq_len());
  Llama model(o);
  load_model_weights(folder, model);
  const auto params = model.named_parameters();
  const torch::ScalarType type = dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  auto add = [&](const std::string& hf, const std::string& ours, int64_t rotary_heads = 0) {
    const torch::Tensor* t = params.find(ours);
    MLLM_CHECK(t != nullptr, "export_hf: the llama model has no parameter " + ours);
    torch::Tensor w = t->detach();
    if (rotary_heads > 0) w = to_rotate_half(w, rotary_heads);
    tensors.emplace_back(hf, w.to(type).contiguous());
  };
  add("model.embed_tokens.weight", "tok_emb.weight");
  for (int64_t l = 0; l < o.n_layers; ++l) {
    const std::string hf = fmt::format("model.layers.{}.", l), ours = fmt::format("layers.{}.", l);
    add(hf + "self_attn.q_proj.weight", ours + "attn.q_proj.weight", o.n_heads);
    add(hf + "self_attn.k_proj.weight", ours + "attn.k_proj.weight", o.n_kv_heads);
    add(hf + "self_attn.v_proj.weight", ours + "attn.v_proj.weight");
    add(hf + "self_attn.o_proj.weight", ours + "attn.o_proj.weight");
    add(hf + "mlp.gate_proj.weight", ours + "ffn.gate_proj.weight");
    add(hf + "mlp.up_proj.weight", ours + "ffn.up_proj.weight");
    add(hf + "mlp.down_proj.weight", ours + "ffn.down_proj.weight");
    add(hf + "input_layernorm.weight", ours + "attn_norm.weight");
    add(hf + "post_attention_layernorm.weight", ours + "ffn_norm.weight");
  }
  add("model.norm.weight", "norm.weight");
  if (!o.tie_embeddings) add("lm_head.weight", "lm_head.weight");
  MLLM_CHECK(tensors.size() == params.size(),
             fmt::format("export_hf: mapped {} of the model's {} parameters", tensors.size(), params.size()));

  const fs::path out(out_dir);
  if (fs::exists(out) && !fs::is_directory(out))
    throw ConfigError(fmt::format("--out {}: exists and is not a folder", out_dir));
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) throw Error(fmt::format("--out {}: cannot create the folder: {}", out_dir, ec.message()));
  std::vector<std::string> written;
  auto text_file = [&](const std::string& name, const json& j) {
    write_text(out / name, j.dump(2) + "\n");
    written.push_back((out / name).string());
  };
  write_safetensors(tensors, (out / "model.safetensors").string());
  written.push_back((out / "model.safetensors").string());
  const std::string torch_dtype = dtype == "bf16" ? "bfloat16" : "float32";
  text_file("config.json", {{"architectures", {"LlamaForCausalLM"}},
                            {"model_type", "llama"},
                            {"vocab_size", o.vocab_size},
                            {"hidden_size", o.d_model},
                            {"intermediate_size", o.d_ff},
                            {"num_hidden_layers", o.n_layers},
                            {"num_attention_heads", o.n_heads},
                            {"num_key_value_heads", o.n_kv_heads},
                            {"head_dim", o.d_model / o.n_heads},
                            {"hidden_act", "silu"},
                            {"max_position_embeddings", o.max_seq_len},
                            {"rms_norm_eps", o.norm_eps},
                            {"rope_theta", o.rope_theta},
                            {"rope_scaling", nullptr},
                            {"attention_bias", false},
                            {"mlp_bias", false},
                            {"tie_word_embeddings", o.tie_embeddings},
                            {"initializer_range", o.init_std},
                            {"bos_token_id", kBosId},
                            {"eos_token_id", kEosId},
                            {"pad_token_id", kPadId},
                            {"torch_dtype", torch_dtype},
                            {"use_cache", true}});
  const SampleConfig& s = recipe.sample;
  text_file("generation_config.json", {{"bos_token_id", kBosId},
                                       {"eos_token_id", kEosId},
                                       {"pad_token_id", kPadId},
                                       {"do_sample", s.temperature > 0},
                                       {"temperature", s.temperature > 0 ? s.temperature : 1.0},
                                       {"top_k", s.top_k},
                                       {"top_p", s.top_p},
                                       {"max_new_tokens", s.max_new_tokens}});
  json tok_config = {{"bos_token", kSpecialPieces[kBosId]}, {"eos_token", kSpecialPieces[kEosId]},
                     {"pad_token", kSpecialPieces[kPadId]}, {"unk_token", kSpecialPieces[kUnkId]},
                     {"model_max_length", o.max_seq_len}, {"clean_up_tokenization_spaces", false}};
  if (const auto* bpe = dynamic_cast<const BpeTokenizer*>(tokenizer.get())) {
    write_text(out / "tokenizer.model", bpe->model_proto());
    written.push_back((out / "tokenizer.model").string());
    tok_config["tokenizer_class"] = "LlamaTokenizer";
    tok_config["add_bos_token"] = true;
    tok_config["add_eos_token"] = false;
    tok_config["add_prefix_space"] = false;
    tok_config["legacy"] = false;
  } else if (tokenizer->type() == "char") {
    text_file("tokenizer.json", char_tokenizer_json(*tokenizer));
    tok_config["tokenizer_class"] = "PreTrainedTokenizerFast";
  } else {
    throw ConfigError(fmt::format("tokenizer type {} cannot be exported (char and bpe can)",
                                  tokenizer->type()));
  }
  text_file("tokenizer_config.json", tok_config);
  return written;
}

}  // namespace mllm
