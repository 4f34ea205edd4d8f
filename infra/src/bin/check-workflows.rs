//! `check-workflows [FILE...]`: checks workflow files against `template.yaml` before they are
//! built in: every file loads (an error names the file, the field and what to do), every agent
//! a step names is deployed, and every deployed agent is used. With no file, every file of
//! `shared/workflows/`. Exits 1 on any problem.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use sas_infra::emulation::emulator::workspace_root;
use sas_infra::emulation::template::Template;
use sas_infra::tools::workflows::{Source, deployed_agents, problems};

/// Check workflow files against the template.
#[derive(Debug, Parser)]
#[command(name = "check-workflows")]
struct Args {
    /// The template whose agents the workflows may use.
    #[arg(long, default_value = "template.yaml")]
    template: PathBuf,
    /// Workflow files (default: every file of shared/workflows/).
    files: Vec<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let root = workspace_root();
    let sources = if args.files.is_empty() {
        Source::all_in(&root.join("shared/workflows"))
    } else {
        args.files.iter().map(|f| Source::read(f)).collect()
    };
    let sources = match sources {
        Ok(sources) => sources,
        Err(e) => {
            eprintln!("check-workflows: {e}");
            return ExitCode::from(2);
        }
    };
    let agents = match Template::load(&root.join(&args.template)).and_then(|t| deployed_agents(&t))
    {
        Ok(agents) => agents,
        Err(e) => {
            eprintln!("check-workflows: {}: {e}", args.template.display());
            return ExitCode::from(2);
        }
    };
    let wrong = problems(&sources, &agents);
    for line in &wrong {
        println!("{line}");
    }
    if wrong.is_empty() {
        let names: Vec<&str> = agents.iter().map(|a| a.as_str()).collect();
        println!(
            "{} workflow files fit the template's agents ({})",
            sources.len(),
            names.join(", ")
        );
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
