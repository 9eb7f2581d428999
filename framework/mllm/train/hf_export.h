// Export of a checkpoint as a Hugging Face transformers model folder (mllm-export).
#pragma once

#include <string>
#include <vector>

namespace mllm {

// Writes the standard LlamaForCausalLM folder for a llama checkpoint into `out_dir` (created):
//   config.json             architecture, sizes, rms_norm_eps, rope_theta, tie_word_embeddings,
//                           bos/eos/pad ids (2 / 3 / 0), torch_dtype
//   model.safetensors       model.embed_tokens.weight, model.layers.N.self_attn.{q,k,v,o}_proj,
//                           model.layers.N.mlp.{gate,up,down}_proj, input_layernorm,
//                           post_attention_layernorm, model.norm, lm_head (unless tied); q and
//                           k rows permuted from Meta's interleaved rotary pairs to transformers'
//                           rotate_half layout (as transformers' convert_llama_weights_to_hf.py)
//   generation_config.json  the special ids and the recipe's sampling settings
//   tokenizer               bpe: tokenizer.model (the sentencepiece model) + tokenizer_config.json;
//                           char: tokenizer.json (tokenizers' WordLevel over single characters)
//                           + tokenizer_config.json
// `dtype` is "fp32" or "bf16" (weights are converted from the float32 checkpoint).
// Returns the files written. Throws ConfigError for another model type (minillm has no
// standard equivalent; the message names the checkpoint's own model.safetensors) or dtype,
// CheckpointError for an unreadable checkpoint, Error when a file cannot be written.
std::vector<std::string> export_hf(const std::string& checkpoint_folder, const std::string& out_dir,
                                   const std::string& dtype);

}  // namespace mllm
