//! `agentrl train` (being written).

#[derive(clap::Args)]
pub struct TrainArgs {}

pub fn run(_args: TrainArgs) -> anyhow::Result<()> {
    anyhow::bail!("agentrl train is being written")
}
