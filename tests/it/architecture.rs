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
