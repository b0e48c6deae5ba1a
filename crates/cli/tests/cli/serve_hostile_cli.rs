//! `agentrl serve` under an address-space limit, sent the
//! hostile mix (20 expensive Sokoban creates whose clients hang up after
//! 0.2 s), keeps answering, stays small and serves a well-behaved client.

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::BIN;

/// `agentrl serve` in a child process whose address space is limited to
/// `limit_kib` (the shell's `ulimit -v`, which is setrlimit(RLIMIT_AS)),
/// killed when dropped.
struct Limited {
    child: Child,
    addr: String,
}

impl Limited {
    fn start(limit_kib: u64, args: &str) -> Self {
        let script = format!("ulimit -v {limit_kib} && exec \"$0\" serve --port 0 {args}");
        let mut child = Command::new("sh")
            .args(["-c", &script, BIN])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        let addr = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("http://"))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_string();
        Limited { child, addr }
    }

    /// `VmHWM` of /proc/PID/status: the most resident memory the server
    /// has had, in KiB (the `exec` made the shell's pid the server's).
    fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// `METHOD PATH` with `body`: the status and the body of the answer.
    fn request(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut conn = TcpStream::connect(&self.addr).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        write!(
            conn,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).unwrap();
        let status = answer
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = answer
            .split("\r\n\r\n")
            .nth(1)
            .unwrap_or_default()
            .to_string();
        (status, body)
    }
}

impl Drop for Limited {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn abandoned_expensive_creates_leave_the_server_answering_and_small() {
    // The limit under which the issue's server died of an allocation
    // failure (3 GiB).
    let mut server = Limited::start(3 << 20, "--envs sokoban,frozenlake");
    let expensive = r#"{"env": "sokoban", "params": {"size": 16, "boxes": 4, "max_steps": 1000,
        "min_solution_len": 1000, "max_solution_len": 1000, "reverse_steps": 100000}}"#;
    let clients: Vec<_> = (0..20)
        .map(|_| {
            let addr = server.addr.clone();
            std::thread::spawn(move || {
                let mut conn = TcpStream::connect(addr).unwrap();
                write!(
                    conn,
                    "POST /create HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{expensive}",
                    expensive.len()
                )
                .unwrap();
                // The client gives up and hangs up.
                std::thread::sleep(Duration::from_millis(200));
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    // Every build stops (or never starts) once its client is gone.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut health = String::new();
    while Instant::now() < deadline {
        assert!(server.running(), "the server died");
        health = server.request("GET", "/health", "").1;
        if health.contains("\"builds_running\":0") && health.contains("\"builds_waiting\":0") {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(health.contains("\"builds_running\":0"), "{health}");
    // A well-behaved client is served.
    let (status, body) = server.request("POST", "/create", r#"{"env": "frozenlake", "seed": 3}"#);
    assert_eq!(status, 200, "{body}");
    let peak_mib = server.peak_rss_kib() / 1024;
    assert!(peak_mib < 512, "the server's RSS reached {peak_mib} MiB");
    assert!(server.running());
}
