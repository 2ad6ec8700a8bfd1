//! Local stand-ins for a mail server, a webhook receiver and Stripe's event
//! log: the demo points the relay at them, and the integration tests script
//! them to fail.
//!
//! Both record what they receive in memory and, when given a directory, also
//! write each delivery there (`.eml` files, webhook JSON with its headers), so a
//! person can open what the relay sent.

pub mod smtp;
pub mod stripe_events;
pub mod webhook;

use std::path::{Path, PathBuf};

/// Writes `bytes` to `dir/name` through a temporary file and a rename, so a
/// reader watching the directory never opens half a file.
pub(crate) async fn save(dir: &Path, name: &str, bytes: Vec<u8>) -> std::io::Result<PathBuf> {
    let dir = dir.to_owned();
    let name = name.to_owned();
    tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(&name);
        let partial = dir.join(format!(".{name}.partial"));
        std::fs::write(&partial, bytes)?;
        std::fs::rename(&partial, &path)?;
        Ok(path)
    })
    .await
    .map_err(std::io::Error::other)?
}

/// `raw` reduced to characters safe in a file name on every common system.
fn file_stem(raw: &str) -> String {
    let stem: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .take(80)
        .collect();
    let stem = stem.trim_matches('.').to_owned();
    if stem.is_empty() {
        "message".to_owned()
    } else {
        stem
    }
}

#[cfg(test)]
mod tests {
    use super::file_stem;

    #[test]
    fn file_stems_keep_only_portable_characters() {
        assert_eq!(file_stem("job-12.confirmation"), "job-12.confirmation");
        assert_eq!(file_stem("../../etc/passwd"), "_.._etc_passwd");
        assert_eq!(file_stem("a b/c:d"), "a_b_c_d");
        assert_eq!(file_stem(""), "message");
        assert_eq!(file_stem(".."), "message");
    }
}
