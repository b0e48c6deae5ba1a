//! One module per subcommand.

pub mod bench;
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
