// The fixed special token ids of every mllm tokenizer, shared by data (tokenizers, shards) and
// model (padding mask, loss) so that neither layer needs the other. Convention of our reference
// notes: <PAD>=0 <UNK>=1 <BOS>=2 <EOS>=3.
#pragma once

#include <cstdint>

namespace mllm {

inline constexpr int32_t kPadId = 0;  // padding: masked as a key, ignored as a target
inline constexpr int32_t kUnkId = 1;  // characters outside the vocabulary
inline constexpr int32_t kBosId = 2;  // begins every document
inline constexpr int32_t kEosId = 3;  // ends every document; generation stops at it

}  // namespace mllm
