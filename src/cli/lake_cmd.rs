//! `ledgerlake lake schema`: prints the lake table layout (schemas/lake-table.schema.json).

use clap::Subcommand;

/// Lake helpers.
#[derive(Debug, Subcommand)]
pub enum LakeCommand {
    /// Print the lake table layout as JSON: envelope columns with Iceberg field ids, partition
    /// spec, sort order, table properties and snapshot summary keys.
    Schema,
}

pub fn run(cmd: LakeCommand) -> anyhow::Result<()> {
    match cmd {
        LakeCommand::Schema => {
            println!(
                "{}",
                serde_json::to_string_pretty(&crate::lake::schema::layout_json())?
            );
        }
    }
    Ok(())
}
