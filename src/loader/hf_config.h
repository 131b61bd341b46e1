// Hugging Face checkpoint conventions: config.json → ModelConfig, and the
// mapping between HF tensor names and the canonical (GGUF-style) names.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "kvtier/model_config.h"

namespace kvtier {

// Fills a ModelConfig from a parsed config.json (`file` is used in messages).
// Supports model_type llama, mistral (without sliding window), qwen2, qwen3, and
// the mixtures of experts mixtral (arch "llama" with experts) and qwen3_moe
// (arch "qwen3moe").
// n_vocab comes from vocab_size. Throws kvtier::Error naming the file and key.
ModelConfig parse_hf_config(const nlohmann::json& j, const std::string& file);

// End-of-generation token ids from an `eos_token_id` field (int or list of ints);
// empty when absent or null. Throws when it has another type.
std::vector<int> parse_eos_token_ids(const nlohmann::json& j, const std::string& file);

// "model.layers.3.self_attn.q_proj.weight" → "blk.3.attn_q.weight"; empty when the
// name is not one of the canonical weights (the caller keeps it under its HF name).
// Experts: "model.layers.3.mlp.experts.5.up_proj.weight" (qwen3_moe) and
// "model.layers.3.block_sparse_moe.experts.5.w3.weight" (mixtral) →
// "blk.3.ffn_up.5.weight"; their routers "…mlp.gate.weight" /
// "…block_sparse_moe.gate.weight" → "blk.3.ffn_gate_inp.weight".
std::string hf_to_canonical_name(std::string_view hf);
// The inverse; empty for names without an HF counterpart (e.g. rope_freqs.weight).
// Expert and router names follow `model_type` ("mixtral", else qwen3_moe's).
std::string canonical_to_hf_name(std::string_view canonical, std::string_view model_type = "");

}  // namespace kvtier
