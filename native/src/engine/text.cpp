// text.cpp - see text.h.
#include "engine/text.h"

#include "core/error.h"
#include "llama.h"

#include <climits>
#include <string>
#include <vector>

namespace cf {

namespace {

void check_buffer(const char * name, const void * buf, int32_t capacity) {
    if (capacity < 0 || (capacity > 0 && buf == nullptr)) {
        fail_invalid(std::string(name) + ": capacity must be >= 0 with a non-NULL buffer, got " +
                     std::to_string(capacity));
    }
}

[[noreturn]] void fail_too_small(const char * what, int32_t capacity, int32_t need, int32_t * needed) {
    *needed = need;
    throw Error(CF_STATUS_BUFFER_TOO_SMALL, std::string(what) + " buffer holds " + std::to_string(capacity) +
                                                " but " + std::to_string(need) + " are needed");
}

}  // namespace

int32_t tokenize(const llama_vocab * vocab, const char * text, int32_t text_len, bool add_special,
                 bool parse_special, int32_t * tokens, int32_t capacity, int32_t * needed) {
    if (text_len < 0 || (text_len > 0 && text == nullptr)) {
        fail_invalid("text_len must be >= 0 with non-NULL text, got " + std::to_string(text_len));
    }
    check_buffer("tokens", tokens, capacity);
    const int32_t n = llama_tokenize(vocab, text ? text : "", text_len, tokens, capacity, add_special, parse_special);
    if (n == INT32_MIN) {
        fail_invalid("text of " + std::to_string(text_len) + " bytes gives more tokens than int32 can count");
    }
    if (n < 0) {
        fail_too_small("tokens", capacity, -n, needed);
    }
    return n;
}

int32_t detokenize(const llama_vocab * vocab, const int32_t * tokens, int32_t num_tokens, bool remove_special,
                   bool unparse_special, char * buf, int32_t capacity, int32_t * needed) {
    if (num_tokens < 0 || (num_tokens > 0 && tokens == nullptr)) {
        fail_invalid("num_tokens must be >= 0 with non-NULL tokens, got " + std::to_string(num_tokens));
    }
    check_buffer("buf", buf, capacity);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    for (int32_t i = 0; i < num_tokens; ++i) {
        if (tokens[i] < 0 || tokens[i] >= n_vocab) {
            fail_invalid("tokens[" + std::to_string(i) + "] = " + std::to_string(tokens[i]) + " is out of range [0, " +
                         std::to_string(n_vocab) + ")");
        }
    }
    const int32_t n = llama_detokenize(vocab, tokens, num_tokens, buf, capacity, remove_special, unparse_special);
    if (n < 0) {
        fail_too_small("text", capacity, -n, needed);
    }
    return n;
}

int32_t apply_chat_template(const llama_model * model, const char * tmpl, const char * const * roles,
                            const char * const * contents, int32_t num_messages, bool add_assistant, char * buf,
                            int32_t capacity, int32_t * needed) {
    if (num_messages < 0 || (num_messages > 0 && (roles == nullptr || contents == nullptr))) {
        fail_invalid("num_messages must be >= 0 with non-NULL roles and contents, got " + std::to_string(num_messages));
    }
    check_buffer("buf", buf, capacity);
    std::vector<llama_chat_message> messages((size_t) num_messages);
    for (int32_t i = 0; i < num_messages; ++i) {
        if (roles[i] == nullptr || contents[i] == nullptr) {
            fail_invalid("message " + std::to_string(i) + " has a NULL role or content");
        }
        messages[(size_t) i] = llama_chat_message{roles[i], contents[i]};
    }
    const char * chosen = tmpl != nullptr ? tmpl : llama_model_chat_template(model, nullptr);
    if (chosen == nullptr) {
        throw Error(CF_STATUS_UNSUPPORTED, "the model has no chat template; pass a template name such as \"chatml\"");
    }
    const int32_t n = llama_chat_apply_template(chosen, messages.data(), messages.size(), add_assistant, buf, capacity);
    if (n < 0) {
        const std::string shown = std::string(chosen).substr(0, 60);
        throw Error(CF_STATUS_UNSUPPORTED, "chat template not supported by llama_chat_apply_template: \"" + shown +
                                               (std::string(chosen).size() > 60 ? "...\"" : "\""));
    }
    if (n > capacity) {
        fail_too_small("chat prompt", capacity, n, needed);
    }
    return n;
}

}  // namespace cf
