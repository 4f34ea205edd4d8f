//! Builds every `*.json` file of this folder into the crate, in order of name, so that adding a
//! workflow is adding a file: nothing lists them by hand.

use std::fmt::Write as _;
use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    // A file added or removed changes the folder; a file edited is watched on its own below.
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("the crate's folder is readable")
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".json"))
        .collect();
    names.sort();
    let mut code =
        String::from("/// Every workflow file of the crate's folder, in order of name.\n");
    code.push_str("pub const FILES: &[WorkflowFile] = &[\n");
    for name in &names {
        let path = dir.join(name);
        println!("cargo:rerun-if-changed={}", path.display());
        let stem = name.trim_end_matches(".json");
        writeln!(
            code,
            "    WorkflowFile {{ name: {stem:?}, path: concat!(\"shared/workflows/\", {name:?}), json: include_str!({:?}) }},",
            path.display().to_string()
        )
        .expect("writing to a string");
    }
    code.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo")).join("files.rs");
    std::fs::write(out, code).expect("OUT_DIR is writable");
}
