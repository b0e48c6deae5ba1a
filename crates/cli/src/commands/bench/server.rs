//! `agentrl bench server` (being written).

#[derive(clap::Args)]
pub struct BenchServerArgs {}

pub fn run(_args: BenchServerArgs) -> anyhow::Result<()> {
    anyhow::bail!("agentrl bench server is being written")
}
