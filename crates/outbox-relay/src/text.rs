//! Outside text (a receiver's body, a stored error) shortened to one line for
//! display: in an error message, a table cell, a progress line.

/// `text` on one line (whitespace and control characters collapsed), cut to
/// `max_chars` characters, with `…` when cut.
pub fn one_line(text: &str, max_chars: usize) -> String {
    let mut out = String::new();
    let mut chars = 0;
    let words = text
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|w| !w.is_empty());
    for word in words {
        for c in (!out.is_empty())
            .then_some(' ')
            .into_iter()
            .chain(word.chars())
        {
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn text_cut_at_a_word_keeps_the_word_whole_up_to_the_bound() {
        assert_eq!(one_line("héllo wörld", 5), "héllo…");
        assert_eq!(one_line("short", 10), "short");
        assert_eq!(one_line("a\nb", 10), "a b");
    }
}
