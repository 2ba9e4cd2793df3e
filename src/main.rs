//! The `ledgerlake` binary: see `ledgerlake --help` and the library docs.

fn main() -> anyhow::Result<()> {
    ledgerlake::cli::run()
}
