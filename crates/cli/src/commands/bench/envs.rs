//! `agentrl bench envs` (being written).

#[derive(clap::Args)]
pub struct BenchEnvsArgs {}

pub fn run(_args: BenchEnvsArgs) -> anyhow::Result<()> {
    anyhow::bail!("agentrl bench envs is being written")
}
