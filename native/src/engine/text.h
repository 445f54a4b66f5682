// text.h - tokenizer, detokenizer and chat template glue over llama.cpp's vocab and model.
//
// All functions are thread-safe (llama.cpp's tokenizer API is) and report failures by throwing
// cf::Error: INVALID_ARGUMENT (bad pointers, lengths or token ids), BUFFER_TOO_SMALL (the
// out count then holds the needed capacity; see the *_needed out-parameters), UNSUPPORTED
// (unknown chat template, or none in the model).
#pragma once

#include <cstdint>

struct llama_model;
struct llama_vocab;

namespace cf {

// Returns the number of tokens written to tokens[0..capacity); throws BUFFER_TOO_SMALL after
// storing the needed count in *needed.
int32_t tokenize(const llama_vocab * vocab, const char * text, int32_t text_len, bool add_special,
                 bool parse_special, int32_t * tokens, int32_t capacity, int32_t * needed);

// Returns the number of bytes written to buf[0..capacity); throws BUFFER_TOO_SMALL after
// storing the needed byte count in *needed.
int32_t detokenize(const llama_vocab * vocab, const int32_t * tokens, int32_t num_tokens, bool remove_special,
                   bool unparse_special, char * buf, int32_t capacity, int32_t * needed);

// tmpl: template name or text, or nullptr for the model's own. Same buffer protocol as above.
int32_t apply_chat_template(const llama_model * model, const char * tmpl, const char * const * roles,
                            const char * const * contents, int32_t num_messages, bool add_assistant, char * buf,
                            int32_t capacity, int32_t * needed);

}  // namespace cf
