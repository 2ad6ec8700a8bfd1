//! A secret read from a file (`--secret-file PATH`), or from standard input
//! (`--secret-file -`), so that it never shows in `ps`, a shell's history or
//! a CI log the way a `--secret VALUE` does. Every command that takes a
//! secret reads it here, so each one trims, refuses and names its errors
//! alike.

use std::io::Read as _;
use std::path::Path;

use super::ConfigError;

/// The path that means standard input.
pub const STDIN: &str = "-";

/// Larger than any signing secret or API key by far; a path to something
/// that never ends (`/dev/zero`, a log) is refused instead of read whole.
const MAX_SECRET_FILE_BYTES: u64 = 64 * 1024;

/// The secret in `path` (`-`: standard input), given with `flag`: its text
/// without the one newline an editor or `echo` leaves at the end. An
/// unreadable, empty, oversized or non-UTF-8 file is a [`ConfigError`]
/// (exit 2) naming the flag and the path, never the content.
pub fn read_secret_file(flag: &str, path: &Path) -> Result<String, ConfigError> {
    let shown = path.display();
    let refused = |why: String| ConfigError(format!("{flag} {shown}: {why}"));
    let mut bytes = Vec::new();
    let read = if path.as_os_str() == STDIN {
        std::io::stdin()
            .lock()
            .take(MAX_SECRET_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
    } else {
        std::fs::File::open(path)
            .and_then(|file| file.take(MAX_SECRET_FILE_BYTES + 1).read_to_end(&mut bytes))
    };
    read.map_err(|e| refused(format!("cannot read it: {e}")))?;
    if bytes.len() as u64 > MAX_SECRET_FILE_BYTES {
        return Err(refused(format!(
            "larger than {} KiB; is it the right file?",
            MAX_SECRET_FILE_BYTES / 1024
        )));
    }
    let text = String::from_utf8(bytes).map_err(|_| refused("is not UTF-8 text".to_owned()))?;
    let secret = trim_one_newline(&text);
    if secret.is_empty() {
        return Err(refused("is empty; it should hold the secret".to_owned()));
    }
    Ok(secret.to_owned())
}

/// `text` without one trailing `\n` (or `\r\n`): what `echo` and editors
/// add. Other whitespace is the secret's own, for its parser to judge.
fn trim_one_newline(text: &str) -> &str {
    text.strip_suffix('\n')
        .map(|t| t.strip_suffix('\r').unwrap_or(t))
        .unwrap_or(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_trailing_newline_is_trimmed_and_nothing_else() {
        assert_eq!(trim_one_newline("whsec_x\n"), "whsec_x");
        assert_eq!(trim_one_newline("whsec_x\r\n"), "whsec_x");
        assert_eq!(trim_one_newline("whsec_x\n\n"), "whsec_x\n");
        assert_eq!(trim_one_newline("whsec_x"), "whsec_x");
        assert_eq!(trim_one_newline("\n"), "");
    }

    #[test]
    fn errors_name_the_flag_and_the_path_but_never_the_content() {
        let dir = std::env::temp_dir().join(format!("secret-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let empty = dir.join("empty");
        std::fs::write(&empty, "\n").expect("write");
        let error = read_secret_file("--secret-file", &empty).expect_err("empty");
        assert!(
            error.0.contains("--secret-file") && error.0.contains("empty"),
            "{error}"
        );
        assert!(error.0.contains(&empty.display().to_string()), "{error}");
        let missing = dir.join("missing");
        let error = read_secret_file("--secret-file", &missing).expect_err("missing");
        assert!(error.0.contains(&missing.display().to_string()), "{error}");
        let binary = dir.join("binary");
        std::fs::write(&binary, [0xff, 0xfe, b's']).expect("write");
        assert!(read_secret_file("--secret-file", &binary).is_err());
        let good = dir.join("good");
        std::fs::write(&good, "whsec_abc\n").expect("write");
        assert_eq!(
            read_secret_file("--secret-file", &good).expect("read"),
            "whsec_abc"
        );
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
