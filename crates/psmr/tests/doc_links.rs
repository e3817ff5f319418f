//! Every link between the README and the documents under `docs/` leads to
//! a file that exists: a document moved or renamed fails here, not in a
//! reader's browser.

use std::path::{Path, PathBuf};

/// The Markdown files of the README and `docs/`, subfolders included.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    out
}

/// The targets of the inline links of `text` (`[words](target)`) that
/// point into the checkout: not a web address, not an anchor of the same
/// page; without their anchor.
fn local_links(text: &str) -> Vec<&str> {
    text.match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &text[at + 2..];
            let target = &rest[..rest.find(')')?];
            let target = target.split('#').next().unwrap_or("");
            (!target.is_empty() && !target.contains("://") && !target.starts_with("mailto:")).then_some(target)
        })
        .collect()
}

#[test]
fn every_link_between_the_documents_leads_to_a_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let docs = documents(&root);
    assert!(docs.len() > 10, "the documents were found: {docs:?}");
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        for target in local_links(&text) {
            checked += 1;
            if !doc.parent().unwrap().join(target).exists() {
                broken.push(format!("{}: {target}", doc.strip_prefix(&root).unwrap_or(doc).display()));
            }
        }
    }
    assert!(checked > 20, "only {checked} links checked");
    assert!(broken.is_empty(), "links to nothing:\n{}", broken.join("\n"));
}

#[test]
fn links_are_read_as_a_reader_follows_them() {
    let text = "see [a](docs/a.md#part), [b](https://x.org/b) and [c](#here); [d](../d.md)";
    assert_eq!(local_links(text), ["docs/a.md", "../d.md"]);
}

#[test]
fn every_crates_top_doc_points_into_the_guide() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut crates = 0;
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let lib = entry.unwrap().path().join("src/lib.rs");
        let Ok(text) = std::fs::read_to_string(&lib) else { continue };
        let top: Vec<&str> = text.lines().take_while(|l| l.starts_with("//!") || l.starts_with("#![doc")).collect();
        let top = top.join("\n");
        assert!(top.contains("`docs/design.md`"), "{}'s top doc does not point to docs/design.md", lib.display());
        for page in top.split('`').filter(|w| w.starts_with("docs/") && w.ends_with(".md")) {
            assert!(root.join(page).exists(), "{} points to {page}, which does not exist", lib.display());
        }
        crates += 1;
    }
    assert!(crates > 15, "only {crates} crates");
}
