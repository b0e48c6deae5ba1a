//! The load generator of `agentrl bench server`: workers run create → (GET
//! available_actions, POST step)×k → close cycles against a server and record
//! each request's latency in a fixed-size histogram (so a long soak does not
//! grow memory by itself).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Latencies in microseconds, bucketed with ~3% resolution in constant memory.
#[derive(Debug, Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Histogram {
    const LINEAR: u64 = 64;
    const SUB: u64 = 32;

    /// An empty histogram.
    pub fn new() -> Self {
        Self {
            counts: vec![0; Self::bucket(u64::MAX) + 1],
            total: 0,
        }
    }

    fn bucket(us: u64) -> usize {
        if us < Self::LINEAR {
            return us as usize;
        }
        // Exponent e >= 6; the 5 bits below the leading one pick the sub-bucket.
        let e = 63 - us.leading_zeros() as u64;
        let m = (us >> (e - 5)) & (Self::SUB - 1);
        (Self::LINEAR + (e - 6) * Self::SUB + m) as usize
    }

    /// The smallest value of a bucket.
    fn lower(b: usize) -> u64 {
        let b = b as u64;
        if b < Self::LINEAR {
            return b;
        }
        let e = (b - Self::LINEAR) / Self::SUB + 6;
        let m = (b - Self::LINEAR) % Self::SUB;
        (1 << e) | (m << (e - 5))
    }

    /// Record one latency.
    pub fn record(&mut self, d: Duration) {
        let us = d.as_micros().min(u64::MAX as u128) as u64;
        self.counts[Self::bucket(us)] += 1;
        self.total += 1;
    }

    /// Add another histogram's counts.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
    }

    /// Number of recorded values.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The `q` quantile (0..=1) in microseconds (bucket lower bound).
    pub fn quantile_us(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::lower(b);
            }
        }
        Self::lower(self.counts.len() - 1)
    }
}

/// One load run.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// Server root, e.g. `http://127.0.0.1:36001`.
    pub base_url: String,
    pub env: String,
    /// Concurrent workers, each holding one session at a time.
    pub concurrency: usize,
    pub duration: Duration,
    /// Steps per cycle at most (a cycle also ends when the episode does).
    pub steps_per_cycle: usize,
    pub token: Option<String>,
}

/// What a load run measured.
#[derive(Debug, Clone)]
pub struct LoadReport {
    pub concurrency: usize,
    pub elapsed: Duration,
    pub cycles: u64,
    /// Every request (all routes).
    pub all: Histogram,
    /// Per route: `create`, `available_actions`, `step`, `close`.
    pub routes: BTreeMap<&'static str, Histogram>,
    /// Answers that were neither 2xx nor an expected invalid-action 400, plus
    /// transport errors.
    pub errors: u64,
    /// The first error seen, for the report.
    pub first_error: Option<String>,
}

impl LoadReport {
    /// Requests per second over the run.
    pub fn requests_per_sec(&self) -> f64 {
        self.all.count() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

#[derive(Default)]
struct WorkerStats {
    routes: BTreeMap<&'static str, Histogram>,
    cycles: u64,
    errors: u64,
    first_error: Option<String>,
}

impl WorkerStats {
    fn error(&mut self, e: String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(e);
        }
    }
}

/// Run the load: `concurrency` workers until `duration` has passed (each
/// finishes its current cycle, so every session it opened is closed).
pub async fn run_load(cfg: &LoadConfig) -> Result<LoadReport, String> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(cfg.concurrency.max(1))
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
    let start = Instant::now();
    let deadline = start + cfg.duration;
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..cfg.concurrency {
        let client = client.clone();
        let cfg = cfg.clone();
        tasks.spawn(async move { worker(client, cfg, w as u64, deadline).await });
    }
    let mut report = LoadReport {
        concurrency: cfg.concurrency,
        elapsed: Duration::ZERO,
        cycles: 0,
        all: Histogram::new(),
        routes: BTreeMap::new(),
        errors: 0,
        first_error: None,
    };
    while let Some(r) = tasks.join_next().await {
        let s = r.map_err(|e| format!("load worker failed: {e}"))?;
        report.cycles += s.cycles;
        report.errors += s.errors;
        if report.first_error.is_none() {
            report.first_error = s.first_error;
        }
        for (k, h) in s.routes {
            report.all.merge(&h);
            report.routes.entry(k).or_default().merge(&h);
        }
    }
    report.elapsed = start.elapsed();
    Ok(report)
}

async fn call(
    cfg: &LoadConfig,
    stats: &mut WorkerStats,
    route: &'static str,
    req: reqwest::RequestBuilder,
) -> Option<(reqwest::StatusCode, Value)> {
    let req = match &cfg.token {
        Some(t) => req.bearer_auth(t),
        None => req,
    };
    let t0 = Instant::now();
    let result = async {
        let r = req.send().await?;
        let status = r.status();
        let bytes = r.bytes().await?;
        Ok::<_, reqwest::Error>((status, bytes))
    }
    .await;
    stats.routes.entry(route).or_default().record(t0.elapsed());
    match result {
        Ok((status, bytes)) => {
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let expected =
                status.is_success() || (status == 400 && body["kind"] == "invalid_action");
            if !expected {
                stats.error(format!("{route}: {status} {body}"));
            }
            Some((status, body))
        }
        Err(e) => {
            stats.error(format!("{route}: {e}"));
            None
        }
    }
}

async fn worker(
    client: reqwest::Client,
    cfg: LoadConfig,
    w: u64,
    deadline: Instant,
) -> WorkerStats {
    let base = cfg.base_url.trim_end_matches('/').to_string();
    let mut stats = WorkerStats::default();
    // A tiny LCG: the bench needs variety, not statistical quality.
    let mut state = w
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    };
    while Instant::now() < deadline {
        let seed = next() % 100_000;
        let create = client
            .post(format!("{base}/create"))
            .json(&json!({"env": cfg.env, "seed": seed}));
        let Some((status, v)) = call(&cfg, &mut stats, "create", create).await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let Some(id) = v["id"].as_u64().filter(|_| status.is_success()) else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        for _ in 0..cfg.steps_per_cycle {
            let get = client
                .get(format!("{base}/available_actions"))
                .query(&[("id", id)]);
            let Some((_, actions)) = call(&cfg, &mut stats, "available_actions", get).await else {
                break;
            };
            let actions = actions.as_array().cloned().unwrap_or_default();
            let action = if actions.is_empty() {
                "noop".to_string()
            } else {
                actions[(next() as usize) % actions.len()]
                    .as_str()
                    .unwrap_or("noop")
                    .to_string()
            };
            let step = client
                .post(format!("{base}/step"))
                .json(&json!({"id": id, "action": action}));
            let Some((_, v)) = call(&cfg, &mut stats, "step", step).await else {
                break;
            };
            if v["done"] == true || v["kind"] == "episode_over" {
                break;
            }
        }
        let close = client
            .post(format!("{base}/close"))
            .json(&json!({"id": id}));
        call(&cfg, &mut stats, "close", close).await;
        stats.cycles += 1;
    }
    stats
}

/// Resident set size of this process in KiB (from /proc/self/status).
pub fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_are_within_bucket_resolution() {
        let mut h = Histogram::new();
        for us in 1..=10_000u64 {
            h.record(Duration::from_micros(us));
        }
        let p50 = h.quantile_us(0.5) as f64;
        let p99 = h.quantile_us(0.99) as f64;
        assert!((p50 - 5000.0).abs() / 5000.0 < 0.04, "p50 {p50}");
        assert!((p99 - 9900.0).abs() / 9900.0 < 0.04, "p99 {p99}");
        assert_eq!(h.count(), 10_000);
    }

    #[test]
    fn histogram_bucket_bounds_are_monotonic() {
        let mut last = 0;
        for b in 1..Histogram::bucket(1 << 40) {
            let lo = Histogram::lower(b);
            assert!(lo > last, "bucket {b}");
            assert_eq!(Histogram::bucket(lo), b);
            last = lo;
        }
    }
}
