//! `agentrl bench model` (being written).

#[derive(clap::Args)]
pub struct BenchModelArgs {}

pub fn run(_args: BenchModelArgs) -> anyhow::Result<()> {
    anyhow::bail!("agentrl bench model is being written")
}
