//! `agentrl config --reference`: every config section and key with its
//! type, default and doc comment (docs/src/config.md is its output);
//! `agentrl config [CONFIG] [key=value …]`: the resolved config.

use std::path::Path;

use agentrl_trainer::config_reference::reference_markdown;
use agentrl_trainer::TrainConfig;

#[derive(clap::Args)]
pub struct ConfigArgs {
    /// Print the configuration reference (Markdown) instead of a config.
    #[arg(long, conflicts_with = "args")]
    reference: bool,
    /// A TOML config (default: the embedded one), then `section.key=value`
    /// overrides; the resolved config is printed as TOML.
    #[arg(value_name = "CONFIG_OR_OVERRIDE")]
    args: Vec<String>,
}

pub fn run(a: ConfigArgs) -> anyhow::Result<()> {
    if a.reference {
        print!("{}", reference_markdown()?);
        return Ok(());
    }
    let (path, overrides) = match a.args.split_first() {
        Some((first, rest)) if !first.contains('=') => (Some(Path::new(first)), rest),
        _ => (None, a.args.as_slice()),
    };
    print!("{}", TrainConfig::load(path, overrides)?.to_toml()?);
    Ok(())
}
