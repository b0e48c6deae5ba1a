//! `agentrl generate` (being written).

#[derive(clap::Args)]
pub struct GenerateArgs {}

pub fn run(_args: GenerateArgs) -> anyhow::Result<()> {
    anyhow::bail!("agentrl generate is being written")
}
