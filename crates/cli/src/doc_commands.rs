//! The commands the README and the book show must run as written: every
//! `agentrl …` line of their `sh` / `bash` code blocks is parsed with this
//! binary's own command line, and every training config it names, with its
//! `section.key=value` overrides, is loaded and checked. A renamed flag, a
//! removed subcommand or a misspelt config key in the documentation fails
//! here. (Running them is the job of the tests that own each feature; this
//! one needs no network, no GPU and no model files.)

use std::path::{Path, PathBuf};

use clap::Parser;

use crate::Cli;

/// The repository root (this crate is `crates/cli`).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// README.md and every Markdown file under docs/src.
fn documentation_files() -> Vec<PathBuf> {
    let root = repo_root();
    let mut files = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs/src")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut entries: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files
}

/// The shell lines of a document's `sh`, `bash` and `console` blocks, with
/// `\` continuations joined; each with its 1-based line number.
fn shell_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_shell = false;
    let mut in_other = false;
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            if in_shell || in_other {
                in_shell = false;
                in_other = false;
            } else if matches!(info.trim(), "sh" | "bash" | "console" | "shell") {
                in_shell = true;
            } else {
                in_other = true;
            }
            continue;
        }
        if !in_shell {
            continue;
        }
        let (start, mut joined) = pending.take().unwrap_or((i + 1, String::new()));
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                joined.push_str(head);
                joined.push(' ');
                pending = Some((start, joined));
            }
            None => {
                joined.push_str(trimmed);
                out.push((start, joined));
            }
        }
    }
    out
}

/// Splits a shell line into words: single and double quotes group and are
/// removed, an unquoted `#` after a space starts a comment. `None` for a
/// quote left open.
fn shell_words(line: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut prev_space = true;
    for c in line.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => word.push(c),
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                in_word = true;
            }
            None if c == '#' && prev_space => break,
            None if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            None => {
                word.push(c);
                in_word = true;
            }
        }
        prev_space = quote.is_none() && c.is_whitespace();
    }
    if quote.is_some() {
        return None;
    }
    if in_word {
        words.push(word);
    }
    Some(words)
}

/// The arguments after the program of an `agentrl` invocation on `line`
/// (`agentrl …`, `cargo run [--release] -p agentrl -- …`,
/// `target/release/agentrl …`, after any `VAR=value` assignments and the
/// last `|`), or `None` when the line runs something else or is a synopsis
/// (`[--flag]`, `…`, `a|b` alternatives).
fn agentrl_args(line: &str) -> Option<Vec<String>> {
    let command = line.rsplit(" | ").next()?.trim();
    let command = command.strip_suffix('&').unwrap_or(command).trim();
    let words = shell_words(command)?;
    let mut rest = words
        .iter()
        .skip_while(|w| w.contains('=') && !w.starts_with('-'))
        .map(String::as_str)
        .collect::<Vec<_>>();
    let program = *rest.first()?;
    if program == "cargo" {
        let separator = rest.iter().position(|w| *w == "--")?;
        let head = &rest[..separator];
        if !(head.contains(&"run") && head.windows(2).any(|p| p == ["-p", "agentrl"])) {
            return None;
        }
        rest = rest.split_off(separator + 1);
    } else if program == "agentrl" || program.ends_with("/agentrl") {
        rest.remove(0);
    } else {
        return None;
    }
    // A redirection or a following command ends the invocation's arguments.
    if let Some(end) = rest.iter().position(|w| {
        matches!(*w, "<" | "&&" | "||" | ";") || w.starts_with('>') || w.starts_with("2>")
    }) {
        rest.truncate(end);
    }
    let synopsis = rest
        .iter()
        .any(|w| w.starts_with("[-") || w.contains('…') || (w.contains('|') && !w.contains('=')));
    if synopsis {
        return None;
    }
    Some(rest.into_iter().map(str::to_string).collect())
}

/// For `train` and `config`: the config file (relative to the repository
/// root) and the overrides, as the commands split them.
fn config_and_overrides(args: &[String]) -> Option<(Option<PathBuf>, Vec<String>)> {
    let (sub, rest) = args.split_first()?;
    if sub != "train" && sub != "config" {
        return None;
    }
    let mut positional = Vec::new();
    let mut iter = rest.iter();
    while let Some(a) = iter.next() {
        match a.as_str() {
            // Flags with a value: skip the value.
            "--out" => {
                iter.next();
            }
            // A resumed run reads its own config.
            "--resume" => return None,
            "--reference" => return None,
            flag if flag.starts_with("--") => {}
            _ => positional.push(a.clone()),
        }
    }
    match positional.split_first() {
        Some((first, overrides)) if !first.contains('=') => {
            Some((Some(repo_root().join(first)), overrides.to_vec()))
        }
        _ => Some((None, positional)),
    }
}

#[test]
fn every_documented_agentrl_command_parses_and_its_config_loads() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for file in documentation_files() {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let name = file
            .strip_prefix(repo_root())
            .unwrap_or(&file)
            .display()
            .to_string();
        for (line_no, line) in shell_lines(&text) {
            let Some(args) = agentrl_args(&line) else {
                continue;
            };
            checked += 1;
            let argv = std::iter::once("agentrl".to_string()).chain(args.iter().cloned());
            if let Err(e) = Cli::try_parse_from(argv) {
                let first = e.to_string().lines().next().unwrap_or("").to_string();
                failures.push(format!("{name}:{line_no}: `{line}`: {first}"));
                continue;
            }
            if let Some((config, overrides)) = config_and_overrides(&args) {
                if let Some(path) = &config {
                    // A config another page tells the reader to create or
                    // download is not in the tree; its overrides are still
                    // checked against the embedded default.
                    if !path.exists() {
                        continue;
                    }
                }
                if let Err(e) = agentrl_trainer::TrainConfig::load(config.as_deref(), &overrides) {
                    failures.push(format!("{name}:{line_no}: `{line}`: {e}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "documented commands that do not run as written:\n{}",
        failures.join("\n")
    );
    // The README alone shows more than this; finding fewer means the
    // extraction broke, not that the documents are clean.
    assert!(
        checked >= 20,
        "only {checked} agentrl commands found in the docs"
    );
}

#[test]
fn shell_lines_join_continuations_and_skip_other_blocks() {
    let text = "```sh\nagentrl train \\\n  a=1\n```\n```toml\nagentrl = 1\n```\n";
    assert_eq!(
        shell_lines(text),
        vec![(2, "agentrl train  a=1".to_string())]
    );
}

#[test]
fn agentrl_args_find_the_invocation_and_skip_synopses() {
    let words = |s: &[&str]| Some(s.iter().map(|w| w.to_string()).collect::<Vec<_>>());
    assert_eq!(
        agentrl_args("printf 'Up\\n' | agentrl play sokoban --seed 3   # comment"),
        words(&["play", "sokoban", "--seed", "3"])
    );
    assert_eq!(
        agentrl_args("cargo run --release -p agentrl -- bench envs"),
        words(&["bench", "envs"])
    );
    assert_eq!(
        agentrl_args("T=1 agentrl train 'env.endpoint=[\"a\"]' &"),
        words(&["train", "env.endpoint=[\"a\"]"])
    );
    assert_eq!(
        agentrl_args("agentrl train [CONFIG.toml] [--out RUN_DIR]"),
        None
    );
    assert_eq!(
        agentrl_args("agentrl config --reference > docs/src/config.md"),
        words(&["config", "--reference"])
    );
    assert_eq!(
        agentrl_args("agentrl eval RUN 2>&1 && echo done"),
        words(&["eval", "RUN"])
    );
    assert_eq!(agentrl_args("cargo test --workspace"), None);
    assert_eq!(agentrl_args("curl -s localhost:8000/v1/models"), None);
}
