//! `agentrl eval` (being written).

#[derive(clap::Args)]
pub struct EvalArgs {}

pub fn run(_args: EvalArgs) -> anyhow::Result<()> {
    anyhow::bail!("agentrl eval is being written")
}
