//! `agentrl envs` (being written).

#[derive(clap::Args)]
pub struct EnvsArgs {}

pub fn run(_args: EnvsArgs) -> anyhow::Result<()> {
    anyhow::bail!("agentrl envs is being written")
}
