//! ARCHITECTURE.md against the tree: every file it links to exists, and every
//! module of the product crates (two levels deep) is named in it, so the map
//! cannot drift from the code without this test saying where.

use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The source roots whose modules the map lists.
const SOURCE_ROOTS: [&str; 4] = [
    "crates/outbox-core/src",
    "crates/order-service/src",
    "crates/outbox-dev-tools/src",
    "src",
];

fn architecture() -> String {
    std::fs::read_to_string(Path::new(ROOT).join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md")
}

/// The relative targets of the markdown links in `text` (`](target)`),
/// without anchors; web links are left out.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("](") {
        rest = &rest[start + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split('#').next().unwrap_or_default();
        if !target.is_empty() && !target.contains("://") {
            targets.push(target.to_owned());
        }
        rest = &rest[end..];
    }
    targets
}

/// Module files and folders up to two levels below `root`, as paths relative
/// to it (`server.rs`, `effects/`, `effects/order_loader.rs`); `mod.rs` and
/// `lib.rs` stand for their folder or crate and are left out.
fn modules(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut walk = vec![(root.to_path_buf(), 0)];
    while let Some((dir, depth)) = walk.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path: PathBuf = entry.path();
            let relative = path
                .strip_prefix(root)
                .expect("below the root")
                .to_string_lossy()
                .into_owned();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if name != "sql" && depth == 0 {
                    found.push(format!("{relative}/"));
                    walk.push((path, depth + 1));
                }
            } else if name.ends_with(".rs") && name != "mod.rs" && name != "lib.rs" {
                found.push(relative);
            }
        }
    }
    found.sort();
    found
}

#[test]
fn every_file_the_architecture_links_to_exists() {
    let missing: Vec<String> = link_targets(&architecture())
        .into_iter()
        .filter(|target| !Path::new(ROOT).join(target).exists())
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md links to paths that do not exist: {missing:?}"
    );
}

#[test]
fn every_module_of_the_crates_is_on_the_architecture_map() {
    let text = architecture();
    let mut unnamed = Vec::new();
    for root in SOURCE_ROOTS {
        for module in modules(&Path::new(ROOT).join(root)) {
            if !text.contains(&module) {
                unnamed.push(format!("{root}/{module}"));
            }
        }
    }
    assert!(
        unnamed.is_empty(),
        "modules ARCHITECTURE.md does not name (add each to its crate's table): {unnamed:?}"
    );
}

/// The map stays a ten-minute read.
const MAX_BYTES: usize = 20_000;

#[test]
fn the_architecture_opens_with_the_names_table_and_stays_short() {
    let text = architecture();
    assert!(
        text.len() <= MAX_BYTES,
        "ARCHITECTURE.md is {} bytes, over its {MAX_BYTES}",
        text.len()
    );
    let first_section = text.lines().find(|l| l.starts_with("## "));
    assert_eq!(
        first_section,
        Some("## Names"),
        "ARCHITECTURE.md must open with its names table"
    );
}

/// Every `code span` of the map that reads as a path of this repository
/// (`outbox/claim.rs`, `claim_jobs.sql`, `worker_pool/`), each found below
/// one of the source roots, the crates, or the root itself.
fn named_paths(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| {
            !span.is_empty()
                && span
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c))
                && (span.ends_with(".rs") || span.ends_with(".sql") || span.ends_with('/'))
        })
        .map(str::to_owned)
        .collect()
}

/// Whether `path` names a file or folder below one of `roots`, at any depth
/// (`outbox/sql/` is below a crate's src, `claim_jobs.sql` below that).
fn path_exists(roots: &[PathBuf], path: &str) -> bool {
    let relative = path.trim_end_matches('/');
    roots.iter().any(|root| found_below(root, relative))
}

fn found_below(dir: &Path, relative: &str) -> bool {
    if dir.join(relative).exists() {
        return true;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries
        .flatten()
        .filter(|e| e.path().is_dir() && e.file_name() != "target" && e.file_name() != ".git")
        .any(|e| found_below(&e.path(), relative))
}

#[test]
fn every_path_the_architecture_names_exists() {
    let root = Path::new(ROOT);
    let mut roots: Vec<PathBuf> = SOURCE_ROOTS.iter().map(|r| root.join(r)).collect();
    roots.push(root.join("crates"));
    roots.push(root.join("tests"));
    roots.push(root.to_path_buf());
    let missing: Vec<String> = named_paths(&architecture())
        .into_iter()
        .filter(|path| !path_exists(&roots, path))
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist: {missing:?}"
    );
}
