//! `agentrl envs`: the registered environments, their difficulties, turn
//! budgets and seed splits.

use agentrl_env_core::{Split, SPLIT_STRIDE};
use serde_json::json;

/// Arguments of `agentrl envs`.
#[derive(clap::Args)]
pub struct EnvsArgs {
    /// Print one JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

/// The seed range of a split as `start..end` in absolute seeds.
fn split_range(split: Split) -> (u64, u64) {
    (split.offset(), split.offset() + SPLIT_STRIDE)
}

/// Print the registry.
pub fn run(args: EnvsArgs) -> anyhow::Result<()> {
    let descriptors = agentrl_envs::descriptors();
    if args.json {
        let rows: Vec<serde_json::Value> = descriptors
            .iter()
            .map(|d| {
                let splits: serde_json::Map<String, serde_json::Value> = Split::ALL
                    .iter()
                    .map(|s| {
                        let (a, b) = split_range(*s);
                        (s.as_str().to_string(), json!({ "start": a, "end": b }))
                    })
                    .collect();
                json!({
                    "name": d.name,
                    "difficulties": d.difficulties,
                    "default_difficulty": d.difficulties.first(),
                    "default_max_turns": d.default_max_turns,
                    "splits": splits,
                    "summary": d.summary,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    // Long difficulty lists overflow their column rather than widen the table.
    let name_w = descriptors
        .iter()
        .map(|d| d.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let diff_w = descriptors
        .iter()
        .map(|d| d.difficulties.join(", ").len())
        .max()
        .unwrap_or(12)
        .clamp(12, 24);
    println!(
        "{:name_w$}  {:diff_w$}  {:>9}  summary",
        "name", "difficulties", "max turns"
    );
    for d in &descriptors {
        println!(
            "{:name_w$}  {:diff_w$}  {:>9}  {}",
            d.name,
            d.difficulties.join(", "),
            d.default_max_turns,
            d.summary
        );
    }
    println!();
    println!("Seed splits (every environment; `--seed N` is an index inside the split,");
    println!("the task's absolute seed is offset + N, so splits never overlap):");
    for s in Split::ALL {
        let (a, b) = split_range(s);
        println!("  {:5}  {a}..{b}", s.as_str());
    }
    println!("The first difficulty listed is the default.");
    Ok(())
}
