//! The documents hold together: every relative link in the workspace's Markdown files leads to
//! a file that exists, and every `#anchor` to a heading of its file, named as GitHub names
//! them. The README links to documents beside the code, which link back; a heading renamed or
//! a document moved breaks a link silently otherwise.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Every Markdown file of the workspace, outside build output and tool folders.
pub fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || name == "target" || name == "node_modules" {
                continue;
            }
            if path.is_dir() {
                dirs.push(path);
            } else if name.ends_with(".md") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The lines of `text` outside fenced code blocks.
fn prose(text: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    text.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// The anchors of `text`'s headings: lower case, punctuation dropped, spaces as hyphens, and a
/// heading met again numbered `-1`, `-2`...
pub fn anchors(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = Vec::new();
    for line in prose(text) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        let Some(title) = line.get(hashes..).and_then(|t| t.strip_prefix(' ')) else { continue };
        if hashes == 0 || hashes > 6 {
            continue;
        }
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(slug.clone()).or_default();
        anchors.push(if *n == 0 { slug.clone() } else { format!("{slug}-{n}") });
        *n += 1;
    }
    anchors
}

/// The targets of `text`'s inline links (`[text](target)`), outside code blocks and spans.
pub fn links(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose(text) {
        // Code spans may show link syntax without being links.
        let outside: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = outside.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            if let Some(end) = rest.find(')') {
                targets.push(rest[..end].to_owned());
                rest = &rest[end..];
            }
        }
    }
    targets
}

/// What is wrong with the links of the Markdown file at `path`, one line each.
pub fn broken_links(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut broken = Vec::new();
    for target in links(&text) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
        let linked = if file.is_empty() { path.to_path_buf() } else { dir.join(file) };
        if !linked.exists() {
            broken.push(format!("{}: {target}: no file {}", path.display(), linked.display()));
            continue;
        }
        if anchor.is_empty() || linked.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let headings = anchors(&std::fs::read_to_string(&linked).unwrap_or_default());
        if !headings.iter().any(|a| a == anchor) {
            broken.push(format!("{}: {target}: no heading #{anchor}", path.display()));
        }
    }
    broken
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_are_named_as_github_names_them() {
        let text = "# The live page and the demo's report\n```\n# not a heading\n```\n## With `sam local`\n## Cost\n### Cost\n";
        assert_eq!(
            anchors(text),
            ["the-live-page-and-the-demos-report", "with-sam-local", "cost", "cost-1"]
        );
    }

    #[test]
    fn links_in_code_are_not_links() {
        let text = "see [Cost](infra/README.md#cost) and `[a](b)`\n```\n[c](d)\n```\n";
        assert_eq!(links(text), ["infra/README.md#cost"]);
    }

    #[test]
    fn a_link_to_a_missing_heading_or_file_is_found() {
        let dir = std::env::temp_dir().join(format!("sas-docs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let doc = dir.join("a.md");
        std::fs::write(&doc, "# A\n[ok](#a) [gone](#b) [file](missing.md) [web](https://x.y/#z)\n")
            .unwrap();
        let broken = broken_links(&doc);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(broken.len(), 2, "{broken:?}");
    }

    /// The blocks of `text` fenced as `lang`, in order.
    fn blocks(text: &str, lang: &str) -> Vec<String> {
        let mut found = Vec::new();
        let mut open: Option<String> = None;
        for line in text.lines() {
            match (&mut open, line.trim_start().strip_prefix("```")) {
                (None, Some(info)) if info.split([' ', ',']).next() == Some(lang) => {
                    open = Some(String::new());
                }
                (Some(block), Some(_)) => {
                    found.push(std::mem::take(block));
                    open = None;
                }
                (Some(block), None) => {
                    block.push_str(line);
                    block.push('\n');
                }
                (None, _) => {}
            }
        }
        found
    }

    #[test]
    fn the_readme_s_workflow_and_its_starts_are_ones_the_engine_takes() {
        use sas_engine::workflow::Workflow;
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
        let json = blocks(&readme, "json");
        assert!(json.len() >= 2, "the README's workflow and its starts: {json:?}");
        let file = &json[0];
        let workflow = Workflow::from_json(file, &Workflow::agents_in(file)).unwrap();
        assert_eq!(workflow.name(), "tenant-provisioning");
        // Step 6 adds its starts to the same file.
        let starts: serde_json::Value = serde_json::from_str(&format!("{{{}}}", json[1])).unwrap();
        let mut with_starts: serde_json::Value = serde_json::from_str(file).unwrap();
        with_starts["starts"] = starts["starts"].clone();
        let text = with_starts.to_string();
        let started = Workflow::from_json(&text, &Workflow::agents_in(&text)).unwrap();
        assert_eq!(started.starts().len(), 2);
    }

    #[test]
    fn every_link_of_the_documents_leads_somewhere() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let files = markdown_files(root);
        assert!(files.len() >= 7, "the documents were not found: {files:?}");
        let broken: Vec<String> = files.iter().flat_map(|f| broken_links(f)).collect();
        assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    }
}
