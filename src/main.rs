//! The `cutover` command: argument parsing and exit codes only.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc: cutover allocates many small, short-lived objects on the
/// request path and builds large, short-lived structures on activation;
/// glibc malloc spent a third of generation build time in consolidation.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "cutover",
    version,
    about = "An HTTP gateway whose configuration changes in generations"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start serving with a configuration file.
    Run {
        #[arg(short, long)]
        config: PathBuf,
        /// Activate the file (and the files it references) whenever it
        /// changes: an atomic rename and a Kubernetes ConfigMap update
        /// are seen; an invalid write is recorded and changes nothing.
        #[arg(long)]
        watch: bool,
    },
    /// Validate a configuration file offline; exit 1 on any error.
    Check {
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Talk to a running gateway's admin API.
    Ctl(Box<cutover::ctl::CtlArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run { config, watch } => match cutover::run(cutover::Options {
            config,
            watch,
            release_memory: cutover::lifecycle::release_memory,
        }) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("cutover: {error}");
                ExitCode::from(1)
            }
        },
        Command::Check { config } => check(&config),
        Command::Ctl(args) => ExitCode::from(cutover::ctl::run(*args)),
    }
}

fn check(path: &std::path::Path) -> ExitCode {
    let text = match cutover::config::ConfigText::read(path) {
        Ok(text) => text,
        Err(error) => {
            eprintln!("{}: cannot read: {error}", path.display());
            return ExitCode::from(1);
        }
    };
    match cutover::plan::validate(&text) {
        Ok(spec) => {
            println!(
                "{}: ok: {} listeners, {} routes, {} upstreams ({})",
                text.origin,
                spec.listeners.len(),
                spec.routes.len(),
                spec.upstreams.len(),
                spec.config_version
            );
            ExitCode::SUCCESS
        }
        Err(diagnostics) => {
            for d in &diagnostics {
                eprintln!("{}", d.render(&text.origin));
            }
            eprintln!("{}: {} error(s)", text.origin, diagnostics.len());
            ExitCode::from(1)
        }
    }
}
