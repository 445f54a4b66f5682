// test_text_stream.cpp - TextStream (core/text_stream.h): whole UTF-8 characters only, stop strings
// that span pieces or end inside one, held-back stop-string prefixes, and that the released pieces
// always add up to the text a whole decode gives.
#undef NDEBUG  // the checks must run in Release builds too
#include "core/text_stream.h"

#include <cassert>
#include <cstdio>
#include <string>
#include <vector>

using namespace cf;

namespace {

struct Run {
    std::vector<std::string> released;  // one per push, then the flush
    std::string text;                   // all of them concatenated
    bool stopped = false;
    int stop_index = -1;
};

// Push `pieces` in order (stopping at a stop string), then flush unless stopped.
Run run(const std::vector<std::string> & pieces, const std::vector<std::string> & stops) {
    TextStream stream;
    Run r;
    for (const std::string & piece : pieces) {
        std::string out;
        r.stop_index = stream.push(piece.data(), piece.size(), stops, out);
        r.stopped = r.stop_index >= 0;
        r.released.push_back(out);
        r.text += out;
        if (r.stopped) {
            assert(stream.held().empty());
            return r;
        }
    }
    std::string out;
    stream.flush(out);
    r.released.push_back(out);
    r.text += out;
    return r;
}

void test_a_character_split_across_pieces_is_held_until_complete() {
    // "é" = C3 A9, "€" = E2 82 AC, "😀" = F0 9F 98 80
    const Run r = run({"a\xC3", "\xA9 \xE2", "\x82", "\xAC\xF0\x9F", "\x98\x80!"}, {});
    assert((r.released == std::vector<std::string>{"a", "\xC3\xA9 ", "", "\xE2\x82\xAC", "\xF0\x9F\x98\x80!", ""}));
    assert(!r.stopped);
}

void test_invalid_bytes_become_replacement_characters_as_python_decodes_them() {
    // a stray continuation byte, a cut 3-byte character followed by ASCII, a cut character at the end
    const Run r = run({"\x80x", "\xE2\x82", "y", "\xF0\x9F"}, {});
    assert(r.text == "\xEF\xBF\xBDx\xEF\xBF\xBDy\xEF\xBF\xBD");
    assert(r.released.back() == "\xEF\xBF\xBD");  // the cut character is released only at the end
}

void test_a_stop_string_spanning_pieces_stops_and_is_never_released() {
    const Run r = run({"Hello ", "wor", "ld and more"}, {"world"});
    assert(r.stopped && r.text == "Hello ");
    assert((r.released == std::vector<std::string>{"Hello ", "", ""}));  // "wor" was held back
}

void test_a_stop_string_ending_inside_a_piece_cuts_the_piece() {
    const Run r = run({"one two", " three"}, {"o t"});
    assert(r.stopped && r.text == "one tw");
    const Run earliest = run({"abcdef"}, {"ef", "cd"});
    assert(earliest.stopped && earliest.text == "ab" && earliest.stop_index == 1);
    const Run tie = run({"abcdef"}, {"cdx", "cde", "cd"});
    assert(tie.stop_index == 1 && tie.text == "ab");
}

void test_a_prefix_that_does_not_become_a_stop_string_is_released() {
    const Run r = run({"say wo", "w!"}, {"world"});
    assert(!r.stopped && r.text == "say wow!");
    assert((r.released == std::vector<std::string>{"say ", "wow!", ""}));
    const Run ends = run({"ab", "wor"}, {"world"});  // the output ends while a prefix is held
    assert(!ends.stopped && ends.released.back() == "wor" && ends.text == "abwor");
}

void test_multibyte_stop_strings() {
    const Run r = run({"x\xE2\x82", "\xAC", "y"}, {"\xE2\x82\xAC"});  // stop at "€"
    assert(r.stopped && r.text == "x");
}

void test_utf8_complete_prefix() {
    assert(utf8_complete_prefix("ab\xC3", 3) == 2);
    assert(utf8_complete_prefix("ab\xC3\xA9", 4) == 4);
    assert(utf8_complete_prefix("\xE2\x82", 2) == 0);
    assert(utf8_complete_prefix("\xE2(", 2) == 2);  // invalid: released (as U+FFFD) right away
    assert(utf8_complete_prefix("\xED\xA0\x80", 3) == 3);  // a surrogate is invalid, not incomplete
}

}  // namespace

int main() {
    test_a_character_split_across_pieces_is_held_until_complete();
    test_invalid_bytes_become_replacement_characters_as_python_decodes_them();
    test_a_stop_string_spanning_pieces_stops_and_is_never_released();
    test_a_stop_string_ending_inside_a_piece_cuts_the_piece();
    test_a_prefix_that_does_not_become_a_stop_string_is_released();
    test_multibyte_stop_strings();
    test_utf8_complete_prefix();
    std::printf("test_text_stream: OK\n");
    return 0;
}
