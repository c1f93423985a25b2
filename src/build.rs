//! Lays out the release binary's code: the functions a started gateway
//! runs (its start, idle seconds, the shipped example's requests, then
//! TLS and proxying) first and together, in the order of
//! `src/symbol-order.txt`, which `benches/order_file.sh` writes.
//!
//! The kernel maps an executable's pages around each one a process
//! touches, so code that runs once at start, scattered through 19 MiB of
//! `.text`, kept 10 MiB of it resident in an idle gateway; laid out
//! together it is about 3 MiB (docs/performance.md, "The code a gateway
//! runs, together").
//!
//! The file is given only to rust-lld, the linker rustc uses by default
//! on x86_64 Linux since Rust 1.90, and only when nothing names another
//! linker. Anywhere else, or with `CUTOVER_SYMBOL_ORDER=off` (to measure
//! the default layout), the binary is linked as it always was, and the
//! build warns. A name the file lists that the build does not define
//! (another toolchain's, or another Cargo.lock's) is skipped.

use std::env;
use std::path::Path;

const ORDER: &str = "src/symbol-order.txt";

/// Parts of a rustc flag that choose the linker (`-C linker=…`,
/// `-C linker-flavor=…`, `-C link-arg=-fuse-ld=…`, …).
const LINKER_FLAGS: [&str; 5] = [
    "linker=",
    "linker-flavor",
    "linker-features",
    "link-self-contained",
    "fuse-ld",
];

fn main() {
    println!("cargo:rerun-if-changed={ORDER}");
    println!("cargo:rerun-if-changed=src/build.rs");
    for var in [
        "CUTOVER_SYMBOL_ORDER",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        // A linker chosen after a release build was made (cargo sets
        // RUSTC_LINKER from its configuration or this variable).
        "RUSTC_LINKER",
        "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    if env::var("PROFILE").as_deref() != Ok("release") {
        // Other profiles' symbols carry other hashes: nothing would match.
        return;
    }
    if let Some(reason) = why_not() {
        println!("cargo:warning=code layout: the linker's default ({reason})");
        return;
    }
    let order = Path::new(&env::var("CARGO_MANIFEST_DIR").unwrap_or_default()).join(ORDER);
    println!(
        "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
        order.display()
    );
    println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
}

/// Why a release build cannot give the linker the ordering file, or
/// `None` if it can.
fn why_not() -> Option<String> {
    if env::var("CUTOVER_SYMBOL_ORDER").as_deref() == Ok("off") {
        return Some("CUTOVER_SYMBOL_ORDER=off".into());
    }
    let target = env::var("TARGET").unwrap_or_default();
    if target != "x86_64-unknown-linux-gnu" {
        return Some(format!("{target} is not linked by rust-lld by default"));
    }
    // Cargo names the linker a configuration or the environment chose.
    if let Some(linker) = env::var_os("RUSTC_LINKER") {
        return Some(format!("linker {} is configured", linker.to_string_lossy()));
    }
    let flags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    let chooses_linker = |flag: &str| LINKER_FLAGS.iter().any(|key| flag.contains(key));
    if flags.split('\x1f').any(chooses_linker) {
        return Some("RUSTFLAGS choose the linker".into());
    }
    // Cargo.toml's rust-version, 1.91, is past 1.90.
    None
}
