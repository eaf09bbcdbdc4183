//! A cargo command run from a process that cargo itself started (`cargo run` of xtask, a test
//! binary under `cargo test`), made as from a shell. Shared by xtask and the upgrade test
//! (tests/src/released.rs includes this file).

use std::process::Command;

/// `cargo` (the one in `CARGO`, else from PATH) without the variables cargo set for the process
/// that runs it (`CARGO_PKG_NAME`, `CARGO_MANIFEST_DIR`, ...). Build scripts that read one of them
/// (ring's does) would otherwise see it change between this build and a plain `cargo build`, and
/// rebuild themselves and everything above them each time.
pub fn cargo_command() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_MANIFEST_")
            || matches!(
                &*k,
                "CARGO_CRATE_NAME" | "CARGO_BIN_NAME" | "CARGO_PRIMARY_PACKAGE"
            )
        {
            c.env_remove(&*k);
        }
    }
    c
}
