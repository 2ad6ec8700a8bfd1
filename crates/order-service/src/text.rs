//! Outside text (a receiver's body, a stored error) shortened to one line for
//! display: in an error message, a table cell, a progress line.

/// Whether `c` is an invisible format control that reorders or hides the
/// text around it: the bidirectional embeddings, overrides, isolates and
/// marks (U+202A–202E, U+2066–2069, U+200E/200F, U+061C), which make
/// `\u{202e}gnp.exe` read as `exe.png` (Trojan Source), and the zero-width
/// and invisible characters that hide text or tell two equal-looking names
/// apart. The joiners U+200C/200D and variation selectors stay allowed:
/// emoji sequences and several scripts need them.
pub fn is_invisible_format_control(c: char) -> bool {
    matches!(
        c,
        '\u{061C}'
            | '\u{180E}'
            | '\u{200B}'
            | '\u{200E}'
            | '\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{2069}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
    )
}

/// `text` on one line (whitespace and control characters collapsed,
/// invisible format controls shown escaped as `\u{202e}`), cut to
/// `max_chars` characters, with `…` when cut.
pub fn one_line(text: &str, max_chars: usize) -> String {
    if is_one_plain_line(text, max_chars) {
        // What the relay writes itself (`published: sequence 17`, for every
        // publish) is already such a line: copied, not walked char by char.
        return text.to_owned();
    }
    let mut out = String::new();
    let mut chars = 0;
    let words = text
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|w| !w.is_empty());
    for word in words {
        let shown = word.chars().flat_map(|c| {
            let escaped = is_invisible_format_control(c).then(|| c.escape_unicode().to_string());
            let plain = escaped.is_none().then_some(c);
            escaped
                .into_iter()
                .flat_map(|e| e.chars().collect::<Vec<_>>())
                .chain(plain)
        });
        for c in (!out.is_empty()).then_some(' ').into_iter().chain(shown) {
            if chars == max_chars {
                out.push('…');
                return out;
            }
            out.push(c);
            chars += 1;
        }
    }
    out
}

/// Whether `text` is what [`one_line`] would make of it: printable ASCII,
/// words one space apart, within `max_chars`.
fn is_one_plain_line(text: &str, max_chars: usize) -> bool {
    text.len() <= max_chars
        && !text.starts_with(' ')
        && !text.ends_with(' ')
        && !text.contains("  ")
        && text.bytes().all(|b| (0x20..0x7f).contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_line_comes_back_as_the_char_by_char_walk_makes_it() {
        for text in [
            "published: sequence 17",
            "a b",
            "x",
            "",
            " a",
            "a  b",
            "a\tb",
            "abcd",
        ] {
            let walked = {
                let mut out = String::new();
                for word in text.split(|c: char| c.is_whitespace() || c.is_control()) {
                    if !word.is_empty() {
                        if !out.is_empty() {
                            out.push(' ');
                        }
                        out.push_str(word);
                    }
                }
                out
            };
            if is_one_plain_line(text, 100) {
                assert_eq!(text, walked, "{text:?}");
            }
            assert_eq!(one_line(text, 100), walked, "{text:?}");
        }
        assert!(!is_one_plain_line("abcd", 3), "over the bound: cut");
    }

    #[test]
    fn text_is_one_bounded_line_cut_on_character_boundaries() {
        assert_eq!(one_line("  a\r\n\tb\u{0}c  ", 200), "a b c");
        let long = "é".repeat(500);
        let cut = one_line(&long, 200);
        assert_eq!(cut.chars().count(), 201);
        assert!(cut.ends_with('…'));
        assert_eq!(one_line("abc", 3), "abc");
        assert_eq!(one_line("", 3), "");
    }

    #[test]
    fn invisible_format_controls_are_shown_escaped() {
        assert_eq!(
            one_line("\u{202e}gnp.exe \u{2066}x\u{2069}", 200),
            "\\u{202e}gnp.exe \\u{2066}x\\u{2069}"
        );
        // Emoji sequences keep their joiners.
        assert_eq!(one_line("👩\u{200d}💻", 200), "👩\u{200d}💻");
    }

    #[test]
    fn text_cut_at_a_word_keeps_the_word_whole_up_to_the_bound() {
        assert_eq!(one_line("héllo wörld", 5), "héllo…");
        assert_eq!(one_line("short", 10), "short");
        assert_eq!(one_line("a\nb", 10), "a b");
    }
}
