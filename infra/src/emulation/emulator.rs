//! Starting an AWS API emulator: moto's server, installed from PyPI into the project's `.venv`
//! when missing, on a free loopback port, and stopped when the process that started it exits
//! (even when that process is killed). It is started through `infra/moto_server.py`, which
//! keeps moto's transactions and bookkeeping from growing with the tables.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The moto release line the tests are written against.
pub const MOTO_REQUIREMENT: &str = "moto[server]>=5.1,<6";

/// A running moto server.
#[derive(Debug)]
pub struct Moto {
    pub endpoint: String,
    _child: Child,
}

static MOTO: OnceLock<Moto> = OnceLock::new();

impl Moto {
    /// The server of this test process, started on first use.
    ///
    /// # Panics
    ///
    /// If moto cannot be installed or started: meant for tests and tools that cannot go on
    /// without it.
    #[allow(clippy::panic)]
    pub fn shared() -> &'static Moto {
        MOTO.get_or_init(|| Moto::start().unwrap_or_else(|e| panic!("cannot start moto: {e}")))
    }

    /// Starts a new server on a free port and waits until it answers.
    pub fn start() -> Result<Moto, String> {
        let python = python()?;
        let port = free_port()?;
        // The server must not outlive the tests, even when they are killed: a shell holds our
        // end of a pipe and stops the server when the pipe closes.
        // moto exits on SIGTERM only once its request threads let it: a busy one may not, so
        // it gets a few seconds, then SIGKILL.
        let script = r#"python="$1"; launcher="$2"; port="$3"; "$python" "$launcher" -H 127.0.0.1 -p "$port" >/dev/null 2>&1 & pid=$!; cat >/dev/null; kill $pid; sleep 3; kill -9 $pid 2>/dev/null"#;
        let launcher = workspace_root().join("infra").join("moto_server.py");
        let child = Command::new("sh")
            .args(["-c", script, "sh"])
            .arg(&python)
            .arg(&launcher)
            .arg(port.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawning moto: {e}"))?;
        let endpoint = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() && answers(port) {
                return Ok(Moto { endpoint, _child: child });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("moto did not answer on {endpoint} within 60 s"))
    }
}

fn answers(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if s.write_all(b"GET /moto-api/ HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200")
        || head.starts_with(b"HTTP/1.0 200")
}

fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    listener.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

/// The workspace root (this crate lives in `infra/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

/// A Python interpreter that can run `python -m moto.server`, installing moto if needed.
fn python() -> Result<PathBuf, String> {
    if let Ok(p) = std::env::var("MOTO_PYTHON") {
        return Ok(PathBuf::from(p));
    }
    python_with(".venv", &[MOTO_REQUIREMENT], "moto.server")
}

/// The Python interpreter of the virtual environment `venv` (a folder of the workspace root),
/// made and given `requirements` from PyPI when `module` cannot be imported from it.
pub fn python_with(venv: &str, requirements: &[&str], module: &str) -> Result<PathBuf, String> {
    // Tests of one binary run on threads of one process, which share the staging folder's name
    // below: one install at a time within a process (other processes have names of their own).
    static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = INSTALLING.lock().unwrap_or_else(|e| e.into_inner());
    let python = workspace_root().join(venv).join("bin/python");
    if can_import(&python, module) {
        return Ok(python);
    }
    if python.exists() {
        // Made for an older list of requirements: add what is missing in place.
        run(Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
            .args(requirements))?;
        return if can_import(&python, module) {
            Ok(python)
        } else {
            Err(format!("{module} is not importable from {}", python.display()))
        };
    }
    // Install into a private directory, then move it into place, so that two test processes
    // installing at once cannot leave a half-made venv behind.
    let staging = workspace_root().join(format!("{venv}.installing.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    run(Command::new("python3").args(["-m", "venv"]).arg(&staging))?;
    run(Command::new(staging.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check"])
        .args(requirements))?;
    if std::fs::rename(&staging, workspace_root().join(venv)).is_err() {
        // Another process won the race; use its venv.
        let _ = std::fs::remove_dir_all(&staging);
    }
    if can_import(&python, module) {
        Ok(python)
    } else {
        Err(format!("{module} is not importable from {}", python.display()))
    }
}

fn can_import(python: &Path, module: &str) -> bool {
    python.exists()
        && Command::new(python)
            .args(["-c", &format!("import {module}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}

fn run(command: &mut Command) -> Result<(), String> {
    let output = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| e.to_string())?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = BufReader::new(&output.stderr[..])
        .lines()
        .map_while(Result::ok)
        .collect::<Vec<_>>()
        .join("\n");
    Err(format!("{command:?} failed: {stderr}"))
}
