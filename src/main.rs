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
        /// Write the configuration file from this folder's Gateway API
        /// resources (and its one `*.toml` of settings) at start, and
        /// again when the folder changes with `--watch`.
        #[arg(long)]
        gateway_api: Option<PathBuf>,
        /// The address the imported listeners bind on.
        #[arg(long, default_value = "0.0.0.0", requires = "gateway_api")]
        gateway_api_address: String,
        /// `NAMESPACE/NAME=ADDRESS`: where one Gateway's listeners bind
        /// (repeatable; before the Gateway's `spec.addresses`).
        #[arg(long = "gateway-address", value_name = "NAMESPACE/NAME=ADDRESS", requires = "gateway_api", value_parser = gateway_address)]
        gateway_addresses: Vec<(String, String)>,
        /// `NAMESPACE/NAME` or `NAMESPACE/*`: a Service the cluster has
        /// though the folder does not describe it (repeatable); routes
        /// reach it by its cluster DNS name. A Service neither described
        /// nor named is `BackendNotFound`.
        #[arg(long = "cluster-service", value_name = "NAMESPACE/NAME", requires = "gateway_api", value_parser = cluster_service)]
        cluster_services: Vec<String>,
    },
    /// Validate a configuration file offline; exit 1 on any error.
    Check {
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Talk to a running gateway's admin API.
    Ctl(Box<cutover::ctl::CtlArgs>),
    /// Write a cutover configuration from another format.
    #[command(subcommand)]
    Import(Import),
}

#[derive(Debug, Subcommand)]
enum Import {
    /// Kubernetes Gateway API resources (YAML files or folders of them):
    /// prints each route's and listener's status conditions; exit 0 when
    /// every one is accepted with its references resolved, 2 when some
    /// are not (the configuration holds the rest), 1 on unreadable input.
    #[command(name = "gateway-api")]
    GatewayApi {
        /// Files or folders of `.yaml`/`.yml` (multi-document).
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Only Gateways of this GatewayClass (default: all).
        #[arg(long)]
        gateway_class: Option<String>,
        /// Write the configuration here (default: standard output, and
        /// the statuses to standard error).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// `input`: Services and EndpointSlices from the resources only;
        /// `dns`: a Service without EndpointSlices (or absent) is its
        /// cluster DNS name.
        #[arg(long, default_value = "input", value_parser = ["input", "dns"])]
        services: String,
        /// The address listeners bind on, for Gateways without one of
        /// their own.
        #[arg(long, default_value = "0.0.0.0")]
        address: String,
        /// `NAMESPACE/NAME=ADDRESS`: where one Gateway's listeners bind
        /// (repeatable; before the Gateway's `spec.addresses`). Two
        /// Gateways never share an address and port.
        #[arg(long = "gateway-address", value_name = "NAMESPACE/NAME=ADDRESS", value_parser = gateway_address)]
        gateway_addresses: Vec<(String, String)>,
        /// With `--services dns`: `NAMESPACE/NAME` or `NAMESPACE/*`, a
        /// Service the cluster has though the resources do not describe
        /// it (repeatable). A Service neither described nor named is
        /// `BackendNotFound`.
        #[arg(long = "cluster-service", value_name = "NAMESPACE/NAME", value_parser = cluster_service)]
        cluster_services: Vec<String>,
        /// `[admin] bind` of the configuration written.
        #[arg(long, default_value = "127.0.0.1:9190")]
        admin: String,
        #[arg(long, default_value = "cluster.local")]
        cluster_domain: String,
        /// A loopback address for the listener that answers 500 for the
        /// share of a rule's requests its unresolved backends would have
        /// had (written only when some rule needs it).
        #[arg(long, default_value = cutover::gatewayapi::INVALID_ADDRESS)]
        invalid_address: String,
    },
}

/// `NAMESPACE/NAME` or `NAMESPACE/*`.
fn cluster_service(text: &str) -> Result<String, String> {
    match text.split_once('/') {
        Some((namespace, name))
            if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
        {
            Ok(text.to_owned())
        }
        _ => Err(format!("{text:?}: expected NAMESPACE/NAME or NAMESPACE/*")),
    }
}

/// `NAMESPACE/NAME=ADDRESS`, the address an IP.
fn gateway_address(text: &str) -> Result<(String, String), String> {
    let (gateway, address) = text
        .split_once('=')
        .ok_or("expected NAMESPACE/NAME=ADDRESS")?;
    if gateway.split('/').count() != 2 || gateway.split('/').any(str::is_empty) {
        return Err(format!("{gateway:?}: expected NAMESPACE/NAME"));
    }
    address
        .parse::<std::net::IpAddr>()
        .map_err(|_| format!("{address:?} is not an IP address"))?;
    Ok((gateway.to_owned(), address.to_owned()))
}

/// Huge pages are held back before anything runs: Rust's runtime
/// allocates before `main`, and the allocator's first touch of its arena
/// would otherwise fault in a 2 MiB page (see `hold_huge_pages`). A
/// constructor (`.init_array`) runs after libc is set up and before the
/// runtime; it only makes one system call.
#[cfg(target_os = "linux")]
#[used]
#[link_section = ".init_array"]
static HOLD_HUGE_PAGES: extern "C" fn() = hold_huge_pages;

#[cfg(target_os = "linux")]
extern "C" fn hold_huge_pages() {
    cutover::lifecycle::hold_huge_pages();
}

fn main() -> ExitCode {
    // One process-wide TLS provider (ring) for the clients that ask rustls
    // for its default (the Redis store's); cutover's own configs name it.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    match cli.command {
        Command::Run {
            config,
            watch,
            gateway_api,
            gateway_api_address,
            gateway_addresses,
            cluster_services,
        } => match cutover::run(cutover::Options {
            config,
            watch,
            gateway_api: gateway_api.map(|dir| cutover::gatewayapi::Source {
                dir,
                address: gateway_api_address,
                gateway_addresses: gateway_addresses.into_iter().collect(),
                cluster_services: cluster_services.into_iter().collect(),
            }),
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
        Command::Import(Import::GatewayApi {
            paths,
            gateway_class,
            output,
            services,
            address,
            gateway_addresses,
            cluster_services,
            admin,
            cluster_domain,
            invalid_address,
        }) => {
            if !cluster_services.is_empty() && services != "dns" {
                eprintln!("cutover import gateway-api: --cluster-service needs --services dns");
                return ExitCode::from(1);
            }
            let options = cutover::gatewayapi::Options {
                gateway_class,
                address,
                gateway_addresses: gateway_addresses.into_iter().collect(),
                services: match services.as_str() {
                    "dns" => cutover::gatewayapi::Services::Dns,
                    _ => cutover::gatewayapi::Services::Input,
                },
                cluster_services: cluster_services.into_iter().collect(),
                cluster_domain,
                admin,
                invalid_address,
                settings: None,
                // HTTPS listeners' certificates go beside the file.
                base_dir: output.as_deref().map(|path| match path.parent() {
                    Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
                    _ => PathBuf::from("."),
                }),
            };
            import_gateway_api(&paths, &options, output.as_deref())
        }
    }
}

fn import_gateway_api(
    paths: &[PathBuf],
    options: &cutover::gatewayapi::Options,
    output: Option<&std::path::Path>,
) -> ExitCode {
    let imported = match cutover::gatewayapi::import(paths, options) {
        Ok(imported) => imported,
        Err(error) => {
            eprintln!("cutover import gateway-api: {error}");
            return ExitCode::from(1);
        }
    };
    let statuses = imported.status_yaml();
    match output {
        Some(path) => {
            if let Err(error) = imported.write(path) {
                eprintln!("cutover import gateway-api: {}: {error}", path.display());
                return ExitCode::from(1);
            }
            print!("{statuses}");
        }
        None => {
            print!("{}", imported.config);
            eprint!("{statuses}");
        }
    }
    for ignored in &imported.ignored {
        eprintln!("not imported: {ignored} (a Gateway API kind cutover does not read)");
    }
    let c = imported.counts;
    eprintln!(
        "imported {} Gateway(s), {} HTTPRoute(s): {} cutover route(s), {} upstream(s)",
        c.gateways, c.routes, c.cutover_routes, c.upstreams
    );
    if imported.all_accepted() {
        ExitCode::SUCCESS
    } else {
        eprintln!("some routes or listeners are not accepted: see their conditions");
        ExitCode::from(2)
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
