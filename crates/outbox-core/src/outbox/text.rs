//! Cleaning text that comes from outside before it is stored.
//!
//! An outcome's error quotes whatever the other side sent: a mail server's
//! reply, an HTTP peer's answer, a library user's own error chain. Any of
//! these can hold a NUL byte (which PostgreSQL's `text` refuses, so a single
//! such outcome would fail its whole batch forever), terminal escapes, or
//! megabytes of HTML. [`clean_error`] makes any of it storable and readable.

/// Longest error text stored, in bytes. Enough for a cause chain and the start
/// of a receiver's body; the rest is cut, and the cut is said.
pub const MAX_ERROR_BYTES: usize = 4096;

/// `text` with every control character (NUL, escapes, newlines, C1, bidi
/// overrides) written as a visible escape such as `\0`, `\n` or `\u{1b}`, cut
/// to at most [`MAX_ERROR_BYTES`] bytes on a character boundary, with a note
/// of how much was cut.
pub(crate) fn clean_error(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(MAX_ERROR_BYTES));
    for (at, c) in text.char_indices() {
        let start = out.len();
        push_visible(&mut out, c);
        if out.len() > MAX_ERROR_BYTES - CUT_NOTE_ROOM {
            out.truncate(start);
            out.push_str(&format!(
                "… [cut: {} more bytes]",
                text.len().saturating_sub(at)
            ));
            break;
        }
    }
    out
}

/// Room kept at the end for the cut note, so the result stays within the bound.
const CUT_NOTE_ROOM: usize = 48;

fn push_visible(out: &mut String, c: char) {
    match c {
        '\0' => out.push_str("\\0"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\\' => out.push('\\'),
        c if c.is_control() || is_bidi_control(c) => {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        }
        c => out.push(c),
    }
}

/// Characters that reorder the text around them when displayed (a terminal or
/// a browser would show a forged error otherwise).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' | '\u{061c}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_and_control_characters_are_shown_escaped() {
        assert_eq!(
            clean_error("451 4.3.0 temporary\0failure\r\n\u{1b}[31mred\u{7f}"),
            "451 4.3.0 temporary\\0failure\\r\\n\\u{1b}[31mred\\u{7f}"
        );
        assert_eq!(
            clean_error("C1 \u{85} bidi \u{202e}"),
            "C1 \\u{85} bidi \\u{202e}"
        );
    }

    #[test]
    fn ordinary_text_in_any_script_is_kept_as_it_is() {
        let text = "550 5.1.1 <анна@example.com>: Benutzer unbekannt — 受信者不明 \\ ok";
        assert_eq!(clean_error(text), text);
    }

    #[test]
    fn a_long_text_is_cut_on_a_character_boundary_and_says_so() {
        let text = "é".repeat(100_000);
        let cleaned = clean_error(&text);
        assert!(cleaned.len() <= MAX_ERROR_BYTES, "{}", cleaned.len());
        assert!(cleaned.starts_with("éé"));
        assert!(
            cleaned.ends_with("more bytes]"),
            "{}",
            &cleaned[cleaned.len() - 40..]
        );
        let cut: usize = cleaned
            .rsplit("[cut: ")
            .next()
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse().ok())
            .expect("the cut note names a byte count");
        let kept = cleaned.len()
            - cleaned
                .rsplit_once('…')
                .map_or(0, |(_, tail)| tail.len() + '…'.len_utf8());
        assert_eq!(
            kept + cut,
            text.len(),
            "kept and cut add up to the original"
        );
    }

    #[test]
    fn escapes_count_against_the_bound() {
        let cleaned = clean_error(&"\0".repeat(10_000));
        assert!(cleaned.len() <= MAX_ERROR_BYTES);
        assert!(cleaned.starts_with("\\0\\0"));
    }
}
