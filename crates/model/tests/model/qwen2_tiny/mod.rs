//! The qwen2-tiny fixture (a transformers checkpoint and its reference
//! outputs in `crates/model/tests/data/qwen2-tiny`), for every crate's tests
//! that check against it. Include it as
//! `#[path = "../../model/tests/model/qwen2_tiny/mod.rs"] mod qwen2_tiny;`.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::PathBuf;

use serde_json::Value;

/// The fixture's directory, from any crate of the workspace.
pub fn fixture_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../model/tests/data/qwen2-tiny"
    ))
}

/// `reference.json`: what transformers computed for the fixture.
pub fn reference() -> Value {
    let text = std::fs::read_to_string(fixture_dir().join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// A JSON array of token ids.
pub fn u32s(v: &Value) -> Vec<u32> {
    let ids = v.as_array().unwrap().iter();
    ids.map(|x| x.as_u64().unwrap() as u32).collect()
}

/// A JSON array of numbers.
pub fn f64s(v: &Value) -> Vec<f64> {
    let xs = v.as_array().unwrap().iter();
    xs.map(|x| x.as_f64().unwrap()).collect()
}
