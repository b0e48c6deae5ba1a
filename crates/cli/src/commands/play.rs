//! `agentrl play` (being written).

#[derive(clap::Args)]
pub struct PlayArgs {}

pub fn run(_args: PlayArgs) -> anyhow::Result<()> {
    anyhow::bail!("agentrl play is being written")
}
