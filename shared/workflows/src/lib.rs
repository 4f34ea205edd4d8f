//! The workflows a stack runs, as files of the repository: every `*.json` file of
//! `shared/workflows/` is built into each function that runs the engine, so `sam deploy`
//! carries them all and nothing is uploaded on the side. A file is named after its workflow
//! (`order-fulfilment.json` holds the workflow named `order-fulfilment`).
//!
//! This crate only holds the files; the engine reads and checks them (`Workflow::from_json`),
//! at cold start, in the test suite, and with `sas workflow check`.

/// One workflow file, as it was when the crate was built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkflowFile {
    /// The file's name without `.json`: the name the workflow inside must have.
    pub name: &'static str,
    /// Where the file is in the repository, for messages.
    pub path: &'static str,
    /// Its content.
    pub json: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/files.rs"));

/// The file of the workflow named `name`.
pub fn file(name: &str) -> Option<&'static WorkflowFile> {
    FILES.iter().find(|f| f.name == name)
}

/// The reference workflow's JSON: reserve inventory, charge payment, ship; the first two undone
/// by releasing the stock and refunding.
pub fn order_fulfilment() -> &'static str {
    file("order-fulfilment").map_or("", |f| f.json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_of_the_folder_is_built_in_and_the_reference_is_one() {
        let on_disk = std::fs::read_dir(env!("CARGO_MANIFEST_DIR"))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".json"))
            .count();
        assert_eq!(FILES.len(), on_disk);
        assert!(order_fulfilment().contains("\"order-fulfilment\""));
        assert_eq!(
            file("order-fulfilment").unwrap().path,
            "shared/workflows/order-fulfilment.json"
        );
    }
}
