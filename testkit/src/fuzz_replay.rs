//! Replays a fuzz target's committed corpus and seeds (`fuzz/corpus/<T>`,
//! `fuzz/seeds/<T>`) through the same checks the fuzz target runs
//! (`fuzz/checks/<T>.rs`, which the test includes by `#[path]` as the
//! fuzz target does), so every `cargo test` re-checks every input the
//! fuzzer kept, on stable.

use std::path::{Path, PathBuf};

/// Run `check` on every file of `target`'s corpus and seeds, naming the
/// file that fails; returns how many ran. A target with no file at all is a
/// failure: its corpus was not committed.
pub fn replay(target: &str, check: fn(&[u8])) -> usize {
    // The workspace root's `fuzz/`, whichever crate's test replays it.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut files: Vec<PathBuf> = Vec::new();
    for dir in ["corpus", "seeds"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        files.extend(entries.map(|e| e.expect("a corpus entry").path()));
    }
    files.sort();
    assert!(
        !files.is_empty(),
        "no corpus or seeds for fuzz target `{target}`"
    );
    for path in &files {
        let data = std::fs::read(path).expect("a corpus file");
        if std::panic::catch_unwind(|| check(&data)).is_err() {
            panic!(
                "fuzz target `{target}`: {} fails its checks",
                path.display()
            );
        }
    }
    files.len()
}
