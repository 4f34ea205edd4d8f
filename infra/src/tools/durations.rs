//! How long each function's invocation lasts on AWS, from what can be measured without AWS.
//!
//! An invocation works on the processor and waits on the network. Its processor time is
//! measured on the local stack, which runs the functions' own release binaries
//! (`local-stack durations`, written to `infra/durations.json`): for each kind of function, a
//! part per invocation and a part per message of its batch, fitted over runs whose batches
//! differ in size. Lambda gives a function a share of a vCPU in proportion to its memory, a
//! whole one at [`ONE_VCPU_MB`]: the same work takes that many times longer on a smaller
//! function. The waits (DynamoDB's and SQS's answers, a remote service's) cannot be measured
//! here; they are assumed ([`Durations::WAITS`]) and added as they are.
//!
//! A core of the machine that measured stands for a vCPU of Lambda's: both are cores of a
//! server processor of recent years, and the binaries are built for Lambda's `arm64` there
//! and for the machine's own architecture here.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ceiling::Durations;
use crate::Error;
use crate::emulation::functions::functions;
use crate::emulation::provision::local_names;
use crate::emulation::template::Template;

/// The memory at which a function has the power of one vCPU; below it, that share of one.
/// Lambda gives more than one above it, which the functions' short batches do not use.
pub const ONE_VCPU_MB: f64 = 1769.0;

/// Lambda's part of a cold start, before the function's init: making the environment, fetching
/// the code, the init's TLS handshakes. Not measurable without AWS: assumed, on the slow side of
/// the "under 100 ms to over 1 second" AWS gives for a cold start.
pub const ENVIRONMENT_START_MS: f64 = 500.0;

/// Where `local-stack durations` writes what it measured, from the workspace's root.
pub const MEASURED_FILE: &str = "infra/durations.json";

/// The processor time one kind of function takes, in milliseconds of one core.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Work {
    /// Whatever the invocation carries.
    pub invocation_ms: f64,
    /// For each message of its batch.
    pub message_ms: f64,
    /// What an execution environment takes to start, before its first invocation (Lambda's
    /// `Init Duration`, less its waits): once per environment, so once per cold start.
    #[serde(default)]
    pub init_ms: f64,
}

impl Work {
    /// Processor milliseconds of an invocation that carries `messages`.
    pub fn of_batch(&self, messages: f64) -> f64 {
        self.invocation_ms + self.message_ms * messages
    }

    /// The line through what `runs` measured: milliseconds per invocation against messages per
    /// invocation, by least squares. Where the runs' batches hardly differ, or the line would
    /// give a negative part, the time is put where it must be: all per invocation, or all per
    /// message. An environment's start is averaged over every one the runs started.
    pub fn fit(runs: &[Sample]) -> Work {
        let environments: u64 = runs.iter().map(|r| r.environments).sum();
        let init_seconds: f64 = runs.iter().map(|r| r.init_cpu_seconds).sum();
        Work {
            init_ms: if environments == 0 {
                0.0
            } else {
                1000.0 * init_seconds / environments as f64
            },
            ..Work::line(runs)
        }
    }

    fn line(runs: &[Sample]) -> Work {
        let points: Vec<(f64, f64)> = runs
            .iter()
            .filter(|r| r.invocations > 0)
            .map(|r| {
                let n = r.invocations as f64;
                (r.records as f64 / n, 1000.0 * r.cpu_seconds / n)
            })
            .collect();
        if points.is_empty() {
            return Work::default();
        }
        let n = points.len() as f64;
        let (mx, my) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x / n, b + y / n));
        let sxx: f64 = points.iter().map(|(x, _)| (x - mx).powi(2)).sum();
        let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
        if mx <= 0.0 {
            return Work { invocation_ms: my, message_ms: 0.0, ..Work::default() };
        }
        // Batches that differ by less than one message say nothing of the slope.
        if sxx < 1.0 / n {
            return Work { invocation_ms: 0.0, message_ms: my / mx, ..Work::default() };
        }
        let slope = sxy / sxx;
        let intercept = my - slope * mx;
        if slope < 0.0 {
            Work { invocation_ms: my, message_ms: 0.0, ..Work::default() }
        } else if intercept < 0.0 {
            Work { invocation_ms: 0.0, message_ms: my / mx, ..Work::default() }
        } else {
            Work { invocation_ms: intercept, message_ms: slope, ..Work::default() }
        }
    }
}

/// What one function kind did in one run: its invocations, the messages they carried, and the
/// processor time its processes took.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub invocations: u64,
    pub records: u64,
    pub cpu_seconds: f64,
    /// Its processes, each an execution environment, and the processor time they took to
    /// start, before the run.
    #[serde(default)]
    pub environments: u64,
    #[serde(default)]
    pub init_cpu_seconds: f64,
}

/// One run of the measurement: its template parameters and what each kind of function did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub parameters: BTreeMap<String, String>,
    pub orders: usize,
    pub rate: f64,
    pub seconds: f64,
    pub by_kind: BTreeMap<String, Sample>,
}

/// What `local-stack durations` measured, and on what.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// The command that measured it.
    pub command: String,
    /// The machine it ran on: its cores and architecture.
    pub machine: String,
    /// Each kind of function's work, fitted over the runs.
    pub work: BTreeMap<String, Work>,
    pub runs: Vec<Run>,
}

/// The kinds of function, by the binary they run: every agent on the generic binary is one.
pub const KINDS: [&str; 4] = ["submission", "scheduler", "agent", "supervisor"];

impl Measured {
    /// What `local-stack durations` last wrote to [`MEASURED_FILE`], as the build found it.
    pub fn recorded() -> Result<Measured, Error> {
        serde_json::from_str(include_str!("../../durations.json"))
            .map_err(|e| Error::Template(format!("{MEASURED_FILE}: {e}")))
    }

    /// Fits each kind's work over `runs`.
    pub fn from_runs(command: &str, machine: &str, runs: Vec<Run>) -> Measured {
        let mut work = BTreeMap::new();
        for kind in KINDS {
            let samples: Vec<Sample> =
                runs.iter().filter_map(|r| r.by_kind.get(kind).cloned()).collect();
            work.insert(kind.to_owned(), Work::fit(&samples));
        }
        Measured { command: command.to_owned(), machine: machine.to_owned(), work, runs }
    }

    /// The work of `kind` (none if it was not measured).
    pub fn of(&self, kind: &str) -> Work {
        self.work.get(kind).copied().unwrap_or_default()
    }
}

/// The memory of each kind of function, in MB, as a stack deployed from a template has it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Memory {
    pub submission_mb: f64,
    pub scheduler_mb: f64,
    pub agent_mb: f64,
    pub supervisor_mb: f64,
}

impl Memory {
    /// Every kind at `mb`.
    pub fn all(mb: f64) -> Memory {
        Memory { submission_mb: mb, scheduler_mb: mb, agent_mb: mb, supervisor_mb: mb }
    }

    /// The memory of each kind in a stack of `template` deployed with `overrides`: the
    /// largest of its functions', should they differ.
    pub fn of_stack(template: &Template, overrides: &[(&str, &str)]) -> Result<Memory, Error> {
        let stack = local_names(template, overrides)?;
        let specs = functions(template, &stack)?;
        let of = |kind: &str| {
            specs
                .iter()
                .filter(|f| kind_of(&f.binary) == Some(kind))
                .map(|f| f64::from(f.memory_mb))
                .reduce(f64::max)
                .ok_or_else(|| Error::Template(format!("no function of the template is a {kind}")))
        };
        Ok(Memory {
            submission_mb: of("submission")?,
            scheduler_mb: of("scheduler")?,
            agent_mb: of("agent")?,
            supervisor_mb: of("supervisor")?,
        })
    }
}

/// The kind of function a binary is, if it is one the durations cover.
pub fn kind_of(binary: &str) -> Option<&'static str> {
    KINDS.into_iter().find(|k| *k == binary)
}

/// How many times longer processor work takes on a function of `mb` than on a whole vCPU.
pub fn slowdown(mb: f64) -> f64 {
    (ONE_VCPU_MB / mb).max(1.0)
}

impl Durations {
    /// What each invocation waits for on AWS, without its processor time: DynamoDB's
    /// single-digit-millisecond reads and writes and an SQS send (a submission: one write and
    /// one send; a scheduler's batch: its reads, writes and sends side by side), and a remote
    /// call of about 80 ms for an agent's batch, whose calls are made side by side.
    pub const WAITS: Durations = Durations {
        submission_ms: 30.0,
        scheduler_batch_ms: 40.0,
        agent_batch_ms: 100.0,
        submission_start_ms: ENVIRONMENT_START_MS,
    };

    /// How long invocations last on functions of `memory`: the waits, and the processor time
    /// `measured`, for batches of `batch` messages, slowed to each function's share of a vCPU.
    pub fn on_aws(measured: &Measured, memory: &Memory, batch: f64) -> Durations {
        let w = Durations::WAITS;
        let cpu = |kind: &str, messages: f64, mb: f64| {
            measured.of(kind).of_batch(messages) * slowdown(mb)
        };
        Durations {
            submission_ms: w.submission_ms + cpu("submission", 0.0, memory.submission_mb),
            scheduler_batch_ms: w.scheduler_batch_ms + cpu("scheduler", batch, memory.scheduler_mb),
            agent_batch_ms: w.agent_batch_ms + cpu("agent", batch, memory.agent_mb),
            submission_start_ms: w.submission_start_ms
                + measured.of("submission").init_ms * slowdown(memory.submission_mb),
        }
    }
}

/// The memory sizes compared.
pub const MEMORY_SIZES: [f64; 5] = [128.0, 256.0, 512.0, 1024.0, ONE_VCPU_MB];

/// What was measured, and how long each kind's invocation lasts on AWS by memory size (a
/// batch of 10 for the queues' functions, one request for the submission), in Markdown.
pub fn render(m: &Measured) -> String {
    let mut t = format!(
        "\nProcessor time measured on {} by `{}`, in ms of one core:\n\n",
        m.machine, m.command
    );
    t.push_str(
        "| function | per invocation | per message | a batch of 10 | an environment's start |\n",
    );
    t.push_str("| --- | ---: | ---: | ---: | ---: |\n");
    for kind in KINDS {
        let w = m.of(kind);
        t.push_str(&format!(
            "| {kind} | {:.2} | {:.2} | {:.2} | {:.1} |\n",
            w.invocation_ms,
            w.message_ms,
            w.of_batch(10.0),
            w.init_ms
        ));
    }
    t.push_str("\nAn invocation on AWS, in ms: what it waits for (assumed) and that processor time at the memory's share of a vCPU:\n\n");
    let sizes: Vec<String> = MEMORY_SIZES.iter().map(|mb| format!("{mb:.0} MB")).collect();
    t.push_str(&format!("| function | waits | {} |\n", sizes.join(" | ")));
    t.push_str(&format!("| --- | ---: |{}\n", " ---: |".repeat(sizes.len())));
    let w = Durations::WAITS;
    let rows = [
        ("submission, a request", w.submission_ms),
        ("scheduler, a batch of 10", w.scheduler_batch_ms),
        ("agent, a batch of 10", w.agent_batch_ms),
    ];
    for (name, wait) in rows {
        let cells: Vec<String> = MEMORY_SIZES
            .iter()
            .map(|&mb| {
                let d = Durations::on_aws(m, &Memory::all(mb), 10.0);
                let ms = match name.split(',').next() {
                    Some("submission") => d.submission_ms,
                    Some("scheduler") => d.scheduler_batch_ms,
                    _ => d.agent_batch_ms,
                };
                format!("{ms:.0}")
            })
            .collect();
        t.push_str(&format!("| {name} | {wait:.0} | {} |\n", cells.join(" | ")));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(invocations: u64, records: u64, cpu_seconds: f64) -> Sample {
        Sample { invocations, records, cpu_seconds, ..Sample::default() }
    }

    #[test]
    fn an_environment_s_start_is_averaged_over_every_environment_the_runs_started() {
        let started = |environments, init_cpu_seconds| Sample {
            environments,
            init_cpu_seconds,
            ..sample(10, 10, 0.01)
        };
        // 2 environments of 10 ms and 6 of 14 ms: 13 ms each.
        let work = Work::fit(&[started(2, 0.020), started(6, 0.084)]);
        assert!((work.init_ms - 13.0).abs() < 1e-9, "{work:?}");
        assert_eq!(Work::fit(&[sample(10, 10, 0.01)]).init_ms, 0.0);
    }

    #[test]
    fn a_line_through_two_batch_sizes_splits_the_time_between_invocation_and_message() {
        // 2 ms an invocation and 0.5 ms a message: batches of 1 take 2.5 ms, of 9, 6.5 ms.
        let work = Work::fit(&[sample(1000, 1000, 2.5), sample(100, 900, 0.65)]);
        assert!((work.invocation_ms - 2.0).abs() < 1e-9, "{work:?}");
        assert!((work.message_ms - 0.5).abs() < 1e-9, "{work:?}");
        assert!((work.of_batch(10.0) - 7.0).abs() < 1e-9);
    }

    #[test]
    fn runs_that_cannot_give_a_line_put_the_time_where_it_must_be() {
        // No messages (the submission): all of it per invocation.
        let api = Work::fit(&[sample(200, 0, 0.4), sample(100, 0, 0.2)]);
        assert_eq!(api, Work { invocation_ms: 2.0, message_ms: 0.0, init_ms: 0.0 });
        // Batches alike: all of it per message, which overstates a full batch's, never less.
        let same = Work::fit(&[sample(100, 200, 0.4), sample(100, 210, 0.42)]);
        assert_eq!(same.invocation_ms, 0.0);
        assert!((same.of_batch(2.05) - 4.1).abs() < 1e-9, "{same:?}");
        // Larger batches cheaper: noise, so the mean per invocation.
        let down = Work::fit(&[sample(100, 100, 0.4), sample(100, 900, 0.3)]);
        assert_eq!(down.message_ms, 0.0);
        assert!((down.invocation_ms - 3.5).abs() < 1e-9);
        assert_eq!(Work::fit(&[]), Work::default());
    }

    #[test]
    fn a_small_function_takes_its_processor_time_as_many_times_longer_as_its_share_is_smaller() {
        let mut measured = Measured::default();
        measured
            .work
            .insert("scheduler".into(), Work { invocation_ms: 1.0, message_ms: 0.5, init_ms: 0.0 });
        measured
            .work
            .insert("agent".into(), Work { invocation_ms: 2.0, message_ms: 0.0, init_ms: 0.0 });
        let at_vcpu = Durations::on_aws(&measured, &Memory::all(ONE_VCPU_MB), 10.0);
        assert!((at_vcpu.scheduler_batch_ms - 46.0).abs() < 1e-9);
        assert!((at_vcpu.agent_batch_ms - 102.0).abs() < 1e-9);
        assert!((at_vcpu.submission_ms - 30.0).abs() < 1e-9);
        let small = Durations::on_aws(&measured, &Memory::all(ONE_VCPU_MB / 4.0), 10.0);
        assert!((small.scheduler_batch_ms - 64.0).abs() < 1e-9);
        // Above one vCPU nothing is faster.
        let big = Durations::on_aws(&measured, &Memory::all(4.0 * ONE_VCPU_MB), 10.0);
        assert!((big.scheduler_batch_ms - 46.0).abs() < 1e-9);
    }

    #[test]
    fn the_recorded_measurement_covers_every_kind_and_the_template_gives_each_its_memory() {
        let measured = Measured::recorded().unwrap();
        for kind in KINDS {
            let work = measured.of(kind);
            assert!(work.of_batch(10.0) > 0.0, "{kind}: {work:?}");
        }
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../template.yaml");
        let memory = Memory::of_stack(&Template::load(&path).unwrap(), &[]).unwrap();
        for mb in [memory.submission_mb, memory.scheduler_mb, memory.agent_mb] {
            assert!((128.0..=10_240.0).contains(&mb), "{memory:?}");
        }
    }
}
