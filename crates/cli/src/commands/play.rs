//! `agentrl play ENV`: a person (or a script) plays an environment in the
//! terminal, one action per line on stdin.

use std::io::{BufRead, Read, Write};

use agentrl_env_core::{EnvParams, Split, StepError, TaskSpec};
use anyhow::Context;

/// Arguments of `agentrl play`.
#[derive(clap::Args)]
pub struct PlayArgs {
    /// Environment name (see `agentrl envs`).
    env: String,
    /// Difficulty level (default: the environment's first).
    #[arg(long)]
    difficulty: Option<String>,
    /// Task index inside the split.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Seed split: train, val or test.
    #[arg(long, default_value = "train")]
    split: String,
    /// Print the valid actions before every move.
    #[arg(long)]
    show_actions: bool,
    /// Environment parameter as KEY=VALUE (VALUE is read as JSON when it
    /// parses, else as a string), e.g. `--param slip=0`; repeatable.
    #[arg(long = "param", value_name = "KEY=VALUE")]
    params: Vec<String>,
}

/// Parse repeated `KEY=VALUE` options into env params.
pub(crate) fn parse_params(items: &[String]) -> anyhow::Result<EnvParams> {
    let mut params = EnvParams::new();
    for item in items {
        let (key, value) = item
            .split_once('=')
            .with_context(|| format!("--param '{item}' is not KEY=VALUE"))?;
        let value = serde_json::from_str(value)
            .unwrap_or_else(|_| serde_json::Value::String(value.to_string()));
        params.insert(key.trim().to_string(), value);
    }
    Ok(params)
}

/// Build the spec of `env`, filling in the default difficulty.
pub(crate) fn make_spec(
    env: &str,
    difficulty: Option<&str>,
    split: &str,
    seed: u64,
) -> anyhow::Result<TaskSpec> {
    let desc = agentrl_envs::find(env)?;
    let split: Split = split.parse()?;
    let difficulty = match difficulty {
        Some(d) => d.to_string(),
        None => desc
            .difficulties
            .first()
            .context("environment has no difficulty")?
            .to_string(),
    };
    Ok(TaskSpec::new(env, split, difficulty, seed))
}

/// Longest action line `play` reads: 64 KiB (an action is one short line;
/// reading an unbounded one would hold all of it in memory).
pub(crate) const MAX_ACTION_LINE: usize = 64 * 1024;

/// Read the next line of `input` into `buf` (newline included), reading at
/// most `max` bytes of it. `Ok(false)` at the end of the input; a longer line
/// is an error naming its number, read no further.
fn read_action_line(
    input: &mut impl BufRead,
    buf: &mut Vec<u8>,
    max: usize,
    line_no: usize,
) -> anyhow::Result<bool> {
    buf.clear();
    let n = input
        .take(max as u64 + 1)
        .read_until(b'\n', buf)
        .with_context(|| format!("reading line {line_no} of stdin"))?;
    if n > max && buf.last() != Some(&b'\n') {
        anyhow::bail!(
            "line {line_no} of stdin is longer than {max} bytes: an action is one short line"
        );
    }
    Ok(n > 0)
}

/// Play one episode, reading actions from stdin until the episode ends or
/// the input does.
pub fn run(args: PlayArgs) -> anyhow::Result<()> {
    let spec = make_spec(
        &args.env,
        args.difficulty.as_deref(),
        &args.split,
        args.seed,
    )?;
    let params = parse_params(&args.params)?;
    let mut env = agentrl_envs::make_env(&spec, &params)?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let first = env.reset();
    writeln!(out, "== {spec} ==")?;
    writeln!(out, "{}", env.instructions())?;
    writeln!(out)?;
    writeln!(out, "{first}")?;
    let show_actions = |out: &mut std::io::StdoutLock, env: &dyn agentrl_env_core::Env| {
        writeln!(out, "actions: {}", env.available_actions().join(", "))
    };
    if args.show_actions {
        show_actions(&mut out, env.as_ref())?;
    }
    out.flush()?;

    let mut total = 0.0;
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut buf = Vec::new();
    let mut ended_by_input = true;
    let mut line_no = 0;
    loop {
        line_no += 1;
        if !read_action_line(&mut input, &mut buf, MAX_ACTION_LINE, line_no)? {
            break;
        }
        // Lossy: a stray non-UTF-8 byte is an invalid action, not a crash.
        let line = String::from_utf8_lossy(&buf);
        let action = line.trim_end_matches(['\n', '\r']);
        if action.trim().is_empty() {
            continue;
        }
        match env.step(action) {
            Ok(step) => {
                total += step.reward;
                writeln!(out, "> {}", action.trim())?;
                writeln!(out, "{}", step.observation)?;
                writeln!(
                    out,
                    "reward: {}  done: {}",
                    fmt_reward(step.reward),
                    step.done
                )?;
                if step.done {
                    ended_by_input = false;
                    break;
                }
            }
            Err(StepError::InvalidAction(e)) => {
                writeln!(out, "> {}", action.trim())?;
                writeln!(out, "invalid action: {e}")?;
            }
            Err(StepError::EpisodeOver) => {
                ended_by_input = false;
                break;
            }
        }
        if args.show_actions {
            show_actions(&mut out, env.as_ref())?;
        }
        out.flush()?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "summary: steps {}  total reward {}  success {}  invalid actions {}{}",
        env.steps(),
        fmt_reward(total),
        env.is_success(),
        env.invalid_actions(),
        if ended_by_input && !env.is_done() {
            "  (input ended before the episode)"
        } else {
            ""
        }
    )?;
    Ok(())
}

/// Rewards like −0.1 + 1 accumulate float noise; print them rounded.
fn fmt_reward(r: f64) -> String {
    let s = format!("{:.3}", r);
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn action_lines_are_read_up_to_a_bound() {
        let mut input = std::io::Cursor::new(b"Up\nabcdefgh\nabcdefghi\nlast".to_vec());
        let mut buf = Vec::new();
        assert!(read_action_line(&mut input, &mut buf, 8, 1).unwrap());
        assert_eq!(buf, b"Up\n");
        // Exactly the bound, newline beyond it: still a line.
        assert!(read_action_line(&mut input, &mut buf, 8, 2).unwrap());
        assert_eq!(buf, b"abcdefgh\n");
        let e = read_action_line(&mut input, &mut buf, 8, 3).unwrap_err();
        assert!(
            e.to_string().contains("line 3") && e.to_string().contains("8 bytes"),
            "{e}"
        );
        assert_eq!(buf.len(), 9, "read no further than the bound");
    }

    #[test]
    fn the_last_line_needs_no_newline() {
        let mut input = std::io::Cursor::new(b"Left".to_vec());
        let mut buf = Vec::new();
        assert!(read_action_line(&mut input, &mut buf, 8, 1).unwrap());
        assert_eq!(buf, b"Left");
        assert!(!read_action_line(&mut input, &mut buf, 8, 2).unwrap());
    }
}
