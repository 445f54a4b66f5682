// text_stream.cpp - see text_stream.h.
#include "core/text_stream.h"

#include <algorithm>
#include <cstdint>

namespace cf {

namespace {

const char REPLACEMENT[] = "\xEF\xBF\xBD";  // U+FFFD

enum class Utf8 { VALID, INVALID, INCOMPLETE };

struct Utf8Char {
    Utf8 kind;
    size_t len;  // VALID: the character's bytes; INVALID: bytes one U+FFFD replaces; INCOMPLETE: bytes present
};

// The character starting at s[i] (i < n), by the Unicode "maximal subpart" rule: an invalid
// sequence is replaced by one U+FFFD per longest valid-looking prefix (what Python does).
Utf8Char next_char(const unsigned char * s, size_t n, size_t i) {
    const unsigned char b = s[i];
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b < 0x80) {
        return {Utf8::VALID, 1};
    } else if (b >= 0xC2 && b <= 0xDF) {
        len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
        len = 3;
        lo = b == 0xE0 ? 0xA0 : 0x80;
        hi = b == 0xED ? 0x9F : 0xBF;
    } else if (b >= 0xF0 && b <= 0xF4) {
        len = 4;
        lo = b == 0xF0 ? 0x90 : 0x80;
        hi = b == 0xF4 ? 0x8F : 0xBF;
    } else {
        return {Utf8::INVALID, 1};  // a continuation byte, C0/C1 or F5..FF
    }
    for (size_t k = 1; k < len; ++k) {
        if (i + k >= n) {
            return {Utf8::INCOMPLETE, k};
        }
        const unsigned char c = s[i + k];
        const unsigned char min = k == 1 ? lo : 0x80, max = k == 1 ? hi : 0xBF;
        if (c < min || c > max) {
            return {Utf8::INVALID, k};
        }
    }
    return {Utf8::VALID, len};
}

// Length of the longest tail of text[from, end) that is a proper prefix of a stop string.
size_t stop_prefix_tail(const std::string & text, size_t from, size_t end, const std::vector<std::string> & stops) {
    size_t best = 0;
    for (const std::string & stop : stops) {
        const size_t max_k = std::min(stop.size() - 1, end - from);
        for (size_t k = max_k; k > best; --k) {
            if (text.compare(end - k, k, stop, 0, k) == 0) {
                best = k;
                break;
            }
        }
    }
    return best;
}

}  // namespace

size_t utf8_complete_prefix(const char * s, size_t n) {
    const auto * u = reinterpret_cast<const unsigned char *>(s);
    size_t i = 0;
    while (i < n) {
        const Utf8Char c = next_char(u, n, i);
        if (c.kind == Utf8::INCOMPLETE) {
            break;
        }
        i += c.len;
    }
    return i;
}

void utf8_append_sanitized(const char * s, size_t n, std::string & out) {
    const auto * u = reinterpret_cast<const unsigned char *>(s);
    size_t i = 0;
    while (i < n) {
        const Utf8Char c = next_char(u, n, i);
        if (c.kind == Utf8::VALID) {
            out.append(s + i, c.len);
        } else {
            out.append(REPLACEMENT);
        }
        i += c.len;
    }
}

int TextStream::push(const char * piece, size_t num_bytes, const std::vector<std::string> & stop_strings,
                     std::string & out) {
    held_.append(piece, num_bytes);
    size_t hit = std::string::npos;
    int hit_index = -1;
    for (size_t i = 0; i < stop_strings.size(); ++i) {
        const size_t pos = stop_strings[i].empty() ? std::string::npos : held_.find(stop_strings[i]);
        if (pos < hit) {
            hit = pos;
            hit_index = (int) i;
        }
    }
    if (hit_index >= 0) {
        utf8_append_sanitized(held_.data(), hit, out);
        held_.clear();
        return hit_index;
    }
    size_t release = utf8_complete_prefix(held_.data(), held_.size());
    const size_t tail = stop_prefix_tail(held_, 0, held_.size(), stop_strings);
    release = std::min(release, held_.size() - tail);
    utf8_append_sanitized(held_.data(), release, out);
    held_.erase(0, release);
    return -1;
}

void TextStream::flush(std::string & out) {
    utf8_append_sanitized(held_.data(), held_.size(), out);
    held_.clear();
}

}  // namespace cf
