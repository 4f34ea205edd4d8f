//! Processor time the local stack spends, by part: the emulator, the local stack itself (its
//! gateway, proxy, event sources and checks), each function's processes, and the simulated
//! service. On a machine of few cores they all share, this says what a run's pace is bound by.
//!
//! Read from Linux's `/proc`: elsewhere there is nothing to read, and nothing is shown. A
//! process that dies during the run (a killed function) takes its time with it.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::emulation::local::LocalStack;

/// Processor seconds each part had used at one moment, and what each function had been
/// invoked for until then.
#[derive(Clone, Debug)]
pub struct CpuSample {
    at: Instant,
    by_part: BTreeMap<String, f64>,
    calls: BTreeMap<String, Calls>,
}

/// A function's invocations and the records (messages) they carried.
#[derive(Clone, Copy, Debug, Default)]
struct Calls {
    invocations: u64,
    records: u64,
}

/// What one function did between two samples, and the processor time it took.
#[derive(Clone, Debug)]
pub struct FunctionUse {
    /// Its logical id.
    pub function: String,
    /// The binary it runs: functions of one binary do the same work.
    pub binary: String,
    pub invocations: u64,
    pub records: u64,
    pub cpu_seconds: f64,
}

impl CpuSample {
    /// What every part of `stack` has used so far, or `None` where `/proc` cannot be read.
    pub fn take(stack: &LocalStack) -> Option<CpuSample> {
        let ticks = ticks_per_second()?;
        let ours = std::process::id();
        let table = processes()?;
        let mut by_part: BTreeMap<String, f64> = BTreeMap::new();
        let functions: BTreeMap<u32, &str> = stack
            .functions
            .iter()
            .flat_map(|f| {
                f.processes.iter().filter_map(|p| Some((p.pid()?, f.spec.logical_id.as_str())))
            })
            .collect();
        for (pid, p) in &table {
            let part = if *pid == ours {
                "local-stack".to_owned()
            } else if !descends_from(&table, *pid, ours) {
                continue;
            } else if let Some(function) = functions.get(pid) {
                (*function).to_owned()
            } else if p.command.contains("moto_server") {
                "moto".to_owned()
            } else {
                // A shell that holds the emulator's pipe, or another helper: by its name.
                p.name.clone()
            };
            *by_part.entry(part).or_default() += p.ticks as f64 / ticks;
        }
        let calls = stack
            .functions
            .iter()
            .map(|f| {
                let calls = Calls { invocations: f.api.invocations(), records: f.api.records() };
                (f.spec.logical_id.clone(), calls)
            })
            .collect();
        Some(CpuSample { at: Instant::now(), by_part, calls })
    }

    /// What each function of `stack` did between `earlier` and this sample.
    pub fn uses(&self, earlier: &CpuSample, stack: &LocalStack) -> Vec<FunctionUse> {
        stack
            .functions
            .iter()
            .map(|f| {
                let id = &f.spec.logical_id;
                let (now, then) = (self.calls.get(id), earlier.calls.get(id));
                let count = |c: Option<&Calls>, of: fn(&Calls) -> u64| c.map_or(0, of);
                let cpu = |s: &CpuSample| s.by_part.get(id).copied().unwrap_or(0.0);
                FunctionUse {
                    function: id.clone(),
                    binary: f.spec.binary.clone(),
                    invocations: count(now, |c| c.invocations)
                        .saturating_sub(count(then, |c| c.invocations)),
                    records: count(now, |c| c.records).saturating_sub(count(then, |c| c.records)),
                    cpu_seconds: cpu(self) - cpu(earlier),
                }
            })
            .collect()
    }

    /// What each part used between `earlier` and this sample, busiest first, in a line.
    pub fn since(&self, earlier: &CpuSample) -> String {
        let wall = self.at.duration_since(earlier.at).as_secs_f64();
        let mut used: Vec<(&str, f64)> = self
            .by_part
            .iter()
            .map(|(part, s)| (part.as_str(), s - earlier.by_part.get(part).copied().unwrap_or(0.0)))
            .filter(|(_, s)| *s >= 0.05)
            .collect();
        used.sort_by(|a, b| b.1.total_cmp(&a.1));
        let total: f64 = used.iter().map(|(_, s)| s).sum();
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let parts: Vec<String> = used.iter().map(|(part, s)| format!("{part} {s:.1} s")).collect();
        format!(
            "processor time over {wall:.0} s: {total:.1} s of the {:.0} s that {cores} cores give ({:.0} %): {}\n",
            wall * cores as f64,
            100.0 * total / (wall * cores as f64).max(f64::EPSILON),
            parts.join(", "),
        )
    }
}

#[derive(Debug)]
struct Proc {
    parent: u32,
    name: String,
    command: String,
    /// User and system time, in clock ticks.
    ticks: u64,
}

fn processes() -> Option<BTreeMap<u32, Proc>> {
    let mut table = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        let command = std::fs::read_to_string(entry.path().join("cmdline"))
            .unwrap_or_default()
            .replace('\0', " ");
        if let Some(p) = parse_stat(&stat, command) {
            table.insert(pid, p);
        }
    }
    Some(table)
}

/// `/proc/<pid>/stat`: the name in parentheses (which may hold spaces), then the state, the
/// parent, and, 14th and 15th, user and system time.
fn parse_stat(stat: &str, command: String) -> Option<Proc> {
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let name = stat.get(open + 1..close)?.to_owned();
    let fields: Vec<&str> = stat.get(close + 2..)?.split_whitespace().collect();
    let parent = fields.get(1)?.parse().ok()?;
    let user: u64 = fields.get(11)?.parse().ok()?;
    let system: u64 = fields.get(12)?.parse().ok()?;
    Some(Proc { parent, name, command, ticks: user + system })
}

fn descends_from(table: &BTreeMap<u32, Proc>, mut pid: u32, ancestor: u32) -> bool {
    for _ in 0..64 {
        match table.get(&pid) {
            Some(p) if p.parent == ancestor => return true,
            Some(p) if p.parent > 1 => pid = p.parent,
            _ => return false,
        }
    }
    false
}

/// The processor time process `pid`'s threads have taken, to the nanosecond (`/proc`'s
/// `schedstat` of each thread, where the `stat` ticks count only hundredths of a second): what
/// a process did before its first invocation is a few milliseconds. Threads already ended
/// took theirs with them.
pub fn run_time(pid: u32) -> Option<std::time::Duration> {
    let mut nanos = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) else { continue };
        nanos += stat.split_whitespace().next().and_then(|n| n.parse::<u64>().ok())?;
    }
    Some(std::time::Duration::from_nanos(nanos))
}

/// Linux reports process time in ticks of `USER_HZ`, a hundred a second on every architecture
/// it supports; without `/proc` there is nothing to read.
fn ticks_per_second() -> Option<f64> {
    std::path::Path::new("/proc/self/stat").exists().then_some(100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_is_read_whatever_its_name_holds() {
        let line = "4242 (tokio (rt) 1) S 4000 4242 4000 0 -1 4194560 1 0 0 0 250 40 0 0 20 0 9 0";
        let p = parse_stat(line, "agent".into()).unwrap();
        assert_eq!((p.parent, p.name.as_str(), p.ticks), (4000, "tokio (rt) 1", 290));
    }

    #[test]
    fn a_process_s_run_time_is_read_to_below_a_tick() {
        if run_time(std::process::id()).is_none() {
            return;
        }
        // At least this thread's own time (other threads may end, and take theirs with them),
        // once it has run for 3 ms.
        let own = || {
            let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
            let nanos = stat.split_whitespace().next().unwrap().parse::<u64>().unwrap();
            std::time::Duration::from_nanos(nanos)
        };
        while own() < std::time::Duration::from_millis(3) {}
        let mine = own();
        let taken = run_time(std::process::id()).unwrap();
        assert!(taken >= mine, "{taken:?} for the process, {mine:?} for this thread");
    }

    #[test]
    fn this_process_is_its_own_descendant_only_through_its_children() {
        let Some(table) = processes() else { return };
        let ours = std::process::id();
        assert!(table.contains_key(&ours), "this process reads itself");
        assert!(!descends_from(&table, ours, ours));
    }
}
