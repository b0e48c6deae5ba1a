//! One module per subcommand.

pub mod bench;
pub mod config;
pub mod device;
pub mod envs;
pub mod eval;
pub mod generate;
pub mod merge_lora;
pub mod play;
pub mod report;
pub mod sequence;
pub mod serve;
pub mod serve_policy;
pub mod study;
pub mod train;

/// Owned copies of string literals: the `Vec<String>` of overrides, env
/// names or arguments the commands take, written as literals in tests.
#[cfg(test)]
pub(crate) fn owned_strings(strs: &[&str]) -> Vec<String> {
    strs.iter().map(|s| s.to_string()).collect()
}
