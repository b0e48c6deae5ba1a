//! `agentrl bench TARGET`: throughput benchmarks printing absolute figures.

mod envs;
mod model;
mod rollout;
mod server;
mod server_load;

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    target: BenchTarget,
}

#[derive(clap::Subcommand)]
enum BenchTarget {
    /// Steps per second of every environment (random valid actions, resets included).
    Envs(envs::BenchEnvsArgs),
    /// Model train and sampling tokens per second.
    Model(model::BenchModelArgs),
    /// Rollout phase of a training step, with and without KV cache reuse across turns.
    Rollout(rollout::BenchRolloutArgs),
    /// Env server requests/s and latency under concurrent sessions.
    Server(server::BenchServerArgs),
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.target {
        BenchTarget::Envs(a) => envs::run(a),
        BenchTarget::Model(a) => model::run(a),
        BenchTarget::Rollout(a) => rollout::run(a),
        BenchTarget::Server(a) => server::run(a),
    }
}
