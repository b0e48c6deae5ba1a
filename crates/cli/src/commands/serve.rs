//! `agentrl serve` (being written).

#[derive(clap::Args)]
pub struct ServeArgs {}

pub fn run(_args: ServeArgs) -> anyhow::Result<()> {
    anyhow::bail!("agentrl serve is being written")
}
