// text_stream.h - a request's output text, released piece by piece: whole UTF-8 characters only,
// never a stop string or anything after it. Pure (no llama.cpp); the engine feeds it token pieces.
//
//   output bytes:  | released (sent in events) | held                          |
//                                              ^ a character boundary
//   held = an incomplete UTF-8 character at the end, or a tail that is a proper prefix of a stop
//   string (it may still become one); everything before it is released by push().
//
// Invariant: the concatenation of everything push() and flush() returned is the output text up to
// (not including) the earliest stop string, with invalid UTF-8 replaced by U+FFFD byte by byte,
// as Python's bytes.decode("utf-8", errors="replace") does, and a character cut at the end of the
// output replaced by one U+FFFD. A stop string always starts inside the held bytes (anything that
// could begin one is held), so push() searches only those.
#pragma once

#include <string>
#include <vector>

namespace cf {

class TextStream {
  public:
    // Append a token's bytes; release what can no longer change into `out` (appended).
    // Returns the index in stop_strings of the stop string that now occurs (the earliest; of two
    // at the same place the first listed), else -1. After a hit `out` ends right before it and
    // nothing is held any more (the request must finish; later pushes are not expected).
    int push(const char * piece, size_t num_bytes, const std::vector<std::string> & stop_strings,
              std::string & out);

    // The output ended for another reason: release everything held into `out` (appended); an
    // incomplete character at the end becomes U+FFFD.
    void flush(std::string & out);

    // Bytes held back now (for tests).
    const std::string & held() const { return held_; }

  private:
    std::string held_;
};

// Length of the longest prefix of s[0, n) that is whole UTF-8 characters or invalid bytes (those
// become U+FFFD when released); the rest, if any, is the start of a character that may complete.
size_t utf8_complete_prefix(const char * s, size_t n);

// Append s[0, n) to out with every invalid byte (or cut character) replaced by U+FFFD.
void utf8_append_sanitized(const char * s, size_t n, std::string & out);

}  // namespace cf
