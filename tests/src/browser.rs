//! A headless Chromium for the tests that read a page as a browser draws it.
//!
//! The browser is found, in this order: the program `CHROMIUM` names; `chromium`,
//! `chromium-browser`, `google-chrome` or `google-chrome-stable` on `PATH`; a copy the tests
//! installed before in `.chromium/` at the workspace root. When there is none, the tests install
//! one there themselves, as they install moto into `.venv`: Debian's `chromium` package and the
//! libraries it needs that the machine lacks, fetched with `apt-get` into folders of
//! `.chromium/` (no root needed, nothing written outside the workspace) and unpacked with
//! `dpkg-deb`. That needs a Debian or Ubuntu-like system with apt; elsewhere, install Chromium
//! or Chrome and put it on `PATH` (or name it in `CHROMIUM`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sas_infra::emulation::emulator::workspace_root;

/// Where the tests keep the browser they installed, under the workspace root.
const PRIVATE: &str = ".chromium";

/// Names a Chromium goes by on `PATH`.
const NAMES: [&str; 4] = ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"];

/// A Chromium that runs, with the environment it needs (a private copy needs its libraries).
#[derive(Debug, Clone)]
pub struct Chromium {
    pub program: PathBuf,
    library_path: Option<String>,
}

impl Chromium {
    /// The machine's Chromium, or the tests' own, installed now if there is none.
    pub fn find_or_install() -> Result<Chromium, String> {
        if let Some(named) = std::env::var_os("CHROMIUM") {
            return Chromium::system(PathBuf::from(named))
                .ok_or_else(|| "CHROMIUM names a program that does not run".to_owned());
        }
        let on_path = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .flat_map(|dir| NAMES.map(|name| dir.join(name)))
            .find(|p| p.is_file());
        if let Some(found) = on_path.and_then(Chromium::system) {
            return Ok(found);
        }
        let root = workspace_root().join(PRIVATE);
        // Tests of one process ask at once: one installs while the others wait for it, since
        // they would share its folder.
        static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _installing = INSTALLING.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(installed) = Chromium::private(&root) {
            return Ok(installed);
        }
        install(&root)?;
        Chromium::private(&root).ok_or_else(|| {
            format!("Chromium was installed into {} but does not run", root.display())
        })
    }

    fn system(program: PathBuf) -> Option<Chromium> {
        let chromium = Chromium { program, library_path: None };
        chromium.runs().then_some(chromium)
    }

    /// The copy unpacked under `root`, if it is there and runs.
    fn private(root: &Path) -> Option<Chromium> {
        let unpacked = root.join("root");
        let program = unpacked.join("usr/lib/chromium/chromium");
        if !program.is_file() {
            return None;
        }
        let mut dirs = Vec::new();
        library_dirs(&unpacked, &mut dirs);
        let library_path = std::env::join_paths(dirs).ok()?.into_string().ok()?;
        let chromium = Chromium { program, library_path: Some(library_path) };
        chromium.runs().then_some(chromium)
    }

    /// A command that runs this browser headless, as root too, with nothing fetched from the
    /// network behind the page's back.
    pub fn headless(&self) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.program);
        if let Some(path) = &self.library_path {
            command.env("LD_LIBRARY_PATH", path);
        }
        command.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ]);
        command
    }

    fn runs(&self) -> bool {
        let mut command = Command::new(&self.program);
        if let Some(path) = &self.library_path {
            command.env("LD_LIBRARY_PATH", path);
        }
        command
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

/// Every folder under `dir` that holds a shared library.
fn library_dirs(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut holds = false;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() && !path.is_symlink() {
            library_dirs(&path, found);
        } else if entry.file_name().to_string_lossy().contains(".so") {
            holds = true;
        }
    }
    if holds {
        found.push(dir.to_owned());
    }
}

/// Installs Debian's `chromium` under `root`: apt's package lists and downloads in folders of
/// its own, the packages unpacked into `root/root`. Made in a staging folder and moved into
/// place, so that an interrupted install leaves nothing half-made behind.
fn install(root: &Path) -> Result<(), String> {
    if !Path::new("/usr/bin/apt-get").exists() || !Path::new("/usr/bin/dpkg-deb").exists() {
        return Err(format!(
            "no Chromium found (CHROMIUM, or {} on PATH), and this system has no apt-get to \
             install Debian's into {PRIVATE}/: install Chromium or Chrome",
            NAMES.join(", ")
        ));
    }
    eprintln!("installing Debian's chromium into {} (about 120 MB, once)", root.display());
    let staging = root.with_file_name(format!("{PRIVATE}.installing.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    for dir in ["lists/partial", "cache/archives/partial", "root"] {
        std::fs::create_dir_all(staging.join(dir)).map_err(|e| e.to_string())?;
    }
    let apt = |args: &[&str]| {
        let mut command = Command::new("apt-get");
        command
            .arg("-q")
            .arg(format!("-oDir::State::Lists={}", staging.join("lists").display()))
            .arg(format!("-oDir::Cache={}", staging.join("cache").display()))
            // Nothing of the system's is changed, so its locks are not needed (nor writable
            // by a user).
            .arg("-oDebug::NoLocking=1")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive");
        run(&mut command)
    };
    apt(&["update"])?;
    apt(&["install", "--yes", "--download-only", "--no-install-recommends", "chromium"])?;
    let archives = std::fs::read_dir(staging.join("cache/archives")).map_err(|e| e.to_string())?;
    for package in archives.flatten().map(|e| e.path()) {
        if package.extension().is_some_and(|e| e == "deb") {
            run(Command::new("dpkg-deb").arg("-x").arg(&package).arg(staging.join("root")))?;
        }
    }
    let _ = std::fs::remove_dir_all(staging.join("cache"));
    let _ = std::fs::remove_dir_all(staging.join("lists"));
    if std::fs::rename(&staging, root).is_err() {
        // Another test process installed it first; keep its copy.
        let _ = std::fs::remove_dir_all(&staging);
    }
    Ok(())
}

fn run(command: &mut Command) -> Result<(), String> {
    let output = command.stdin(Stdio::null()).output().map_err(|e| format!("{command:?}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!("{command:?} failed: {}", String::from_utf8_lossy(&output.stderr)))
    }
}
