//! `agentrl bench server`: requests/s and p50/p99 latency of create → step →
//! close cycles at several concurrencies, against an in-process server on a
//! loopback port (or `--url`); `--soak SECS` also reports memory over time.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use agentrl_server::{registry_descriptors, BackgroundServer, ServerConfig};
use anyhow::Context;

use super::server_load::{rss_kib, run_load, LoadConfig, LoadReport};

#[derive(clap::Args)]
pub struct BenchServerArgs {
    /// Concurrent sessions (workers), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,64,1024")]
    sessions: Vec<usize>,
    /// Seconds per concurrency level.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Instead: run this many seconds at the last --sessions level and report
    /// resident memory (RSS of this process, server included) at start and end.
    #[arg(long)]
    soak: Option<u64>,
    /// Environment to cycle through (default: the first registered).
    #[arg(long)]
    env: Option<String>,
    /// Steps per cycle at most (each preceded by GET available_actions).
    #[arg(long, default_value_t = 8)]
    steps: usize,
    /// Use a running server instead of starting one in-process.
    #[arg(long)]
    url: Option<String>,
    /// Bearer token for --url.
    #[arg(long)]
    token: Option<String>,
    /// Worker threads of the in-process server.
    #[arg(long, default_value_t = 2)]
    server_threads: usize,
    /// Worker threads of the load generator.
    #[arg(long, default_value_t = 2)]
    client_threads: usize,
}

pub fn run(args: BenchServerArgs) -> anyhow::Result<()> {
    let descriptors = registry_descriptors(None)?;
    let env = match &args.env {
        Some(e) => e.clone(),
        None => descriptors
            .first()
            .map(|d| d.name.to_string())
            .context("no environment is registered")?,
    };
    let max_level = args.sessions.iter().copied().max().unwrap_or(1);
    // The server steps envs on its async workers rather than via
    // spawn_blocking; this figure is why (a hand-off costs ~10-20 µs).
    if let Some(d) = descriptors.iter().find(|d| d.name == env) {
        if let Some(us) = local_step_us(d) {
            println!("in-process {env} step (random available action): median {us:.1} µs");
        }
    }
    let server = match &args.url {
        Some(_) => None,
        None => Some(BackgroundServer::start(
            ServerConfig {
                addr: SocketAddr::from(([127, 0, 0, 1], 0)),
                max_sessions: (2 * max_level).max(4096),
                // One connection per load-generator session, and room to spare:
                // the bench measures the envs, not the connection cap.
                max_connections: (2 * max_level).max(ServerConfig::default().max_connections),
                ..ServerConfig::default()
            },
            descriptors,
            args.server_threads,
        )?),
    };
    let base = match (&args.url, &server) {
        (Some(u), _) => u.clone(),
        (None, Some(s)) => s.base_url(),
        (None, None) => anyhow::bail!("no server"),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.client_threads.max(1))
        .enable_all()
        .build()?;
    let where_ = if args.url.is_some() {
        "remote"
    } else {
        "in-process"
    };
    println!(
        "bench server: env {env}, {where_} server at {base}, ≤{} steps per cycle",
        args.steps
    );
    let load = |concurrency: usize, secs: f64| LoadConfig {
        base_url: base.clone(),
        env: env.clone(),
        concurrency,
        duration: Duration::from_secs_f64(secs),
        steps_per_cycle: args.steps,
        token: args.token.clone(),
    };

    if let Some(soak) = args.soak {
        return soak_run(&rt, load(max_level, 0.0), soak, server.as_ref());
    }
    println!(
        "{:>8} {:>10} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7}",
        "sessions",
        "requests",
        "req/s",
        "p50 ms",
        "p99 ms",
        "step p50",
        "step p99",
        "cycles",
        "errors"
    );
    for &n in &args.sessions {
        let r = rt
            .block_on(run_load(&load(n, args.seconds)))
            .map_err(anyhow::Error::msg)?;
        print_row(&r);
        if let Some(e) = &r.first_error {
            println!("  first error: {e}");
        }
    }
    if let Some(s) = &server {
        println!("live sessions after the runs: {}", s.live_sessions());
    }
    Ok(())
}

/// Median wall time of one in-process step over ~0.3 s of random play.
fn local_step_us(d: &agentrl_env_core::EnvDescriptor) -> Option<f64> {
    use agentrl_env_core::{Split, TaskSpec};
    let params = agentrl_env_core::EnvParams::new();
    let difficulty = d.difficulties.first()?;
    let mut times = Vec::new();
    let start = Instant::now();
    let mut seed = 0u64;
    while start.elapsed() < Duration::from_millis(300) {
        let mut e = d
            .create(
                &TaskSpec::new(d.name, Split::Train, *difficulty, seed),
                &params,
            )
            .ok()?;
        seed += 1;
        for k in 0..8usize {
            let actions = e.available_actions();
            let Some(a) = actions.get((k * 7 + seed as usize) % actions.len().max(1)) else {
                break;
            };
            let t = Instant::now();
            let r = e.step(a);
            times.push(t.elapsed().as_secs_f64() * 1e6);
            if r.map_or(true, |s| s.done) {
                break;
            }
        }
    }
    times.sort_by(f64::total_cmp);
    times.get(times.len() / 2).copied()
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn print_row(r: &LoadReport) {
    let step = r.routes.get("step").cloned().unwrap_or_default();
    println!(
        "{:>8} {:>10} {:>9.0} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8} {:>7}",
        r.concurrency,
        r.all.count(),
        r.requests_per_sec(),
        ms(r.all.quantile_us(0.5)),
        ms(r.all.quantile_us(0.99)),
        ms(step.quantile_us(0.5)),
        ms(step.quantile_us(0.99)),
        r.cycles,
        r.errors
    );
}

/// Runs in 10-second slices so memory is sampled as it goes.
fn soak_run(
    rt: &tokio::runtime::Runtime,
    cfg: LoadConfig,
    secs: u64,
    server: Option<&BackgroundServer>,
) -> anyhow::Result<()> {
    let rss0 = rss_kib().unwrap_or(0);
    println!(
        "soak: {secs} s at {} sessions; RSS before load {:.1} MiB",
        cfg.concurrency,
        rss0 as f64 / 1024.0
    );
    let start = Instant::now();
    let slice = 10u64.min(secs.max(1));
    let (mut requests, mut errors, mut first_rss, mut max_rss, mut last_rss) =
        (0u64, 0u64, None, 0u64, 0u64);
    while start.elapsed().as_secs() < secs {
        let left = secs
            .saturating_sub(start.elapsed().as_secs())
            .clamp(1, slice);
        let r = rt
            .block_on(run_load(&LoadConfig {
                duration: Duration::from_secs(left),
                ..cfg.clone()
            }))
            .map_err(anyhow::Error::msg)?;
        requests += r.all.count();
        errors += r.errors;
        let rss = rss_kib().unwrap_or(0);
        first_rss.get_or_insert(rss);
        max_rss = max_rss.max(rss);
        last_rss = rss;
        println!(
            "  t={:>5.0}s  {:>7.0} req/s  p50 {:.2} ms  p99 {:.2} ms  RSS {:.1} MiB  live sessions {}",
            start.elapsed().as_secs_f64(),
            r.requests_per_sec(),
            ms(r.all.quantile_us(0.5)),
            ms(r.all.quantile_us(0.99)),
            rss as f64 / 1024.0,
            server.map_or(0, |s| s.live_sessions())
        );
    }
    let first = first_rss.unwrap_or(rss0);
    println!(
        "soak done: {requests} requests, {errors} errors; RSS after first slice {:.1} MiB, at end {:.1} MiB \
         (Δ {:+.1} MiB), max {:.1} MiB",
        first as f64 / 1024.0,
        last_rss as f64 / 1024.0,
        (last_rss as f64 - first as f64) / 1024.0,
        max_rss as f64 / 1024.0
    );
    Ok(())
}
