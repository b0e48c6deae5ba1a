//! What the policy server's tests share: the qwen2-tiny fixture served as
//! `tiny` on loopback, and requests to it.
#![allow(dead_code)] // each test binary uses its own subset

use agentrl_model::candle_core::Device;
use agentrl_model::PolicyModel;
use agentrl_policy_server::{BackgroundPolicyServer, PolicyServerConfig, ServedModel};
use agentrl_tokenizer::ChatTokenizer;
use serde_json::Value;

#[path = "../../../model/tests/model/qwen2_tiny/mod.rs"]
pub mod qwen2_tiny;
use qwen2_tiny::fixture_dir;

/// The fixture's model, without a value head, on the CPU.
pub fn fixture_model() -> PolicyModel {
    PolicyModel::load(&fixture_dir(), false, &Device::Cpu).unwrap()
}

/// `model` with the fixture's tokenizer, served as `tiny` on a free loopback
/// port; `config` sets the rest.
pub fn serve(model: PolicyModel, config: PolicyServerConfig) -> BackgroundPolicyServer {
    let served = ServedModel {
        model,
        tokenizer: ChatTokenizer::load(fixture_dir()).unwrap(),
    };
    let config = PolicyServerConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        served_model_name: "tiny".into(),
        ..config
    };
    BackgroundPolicyServer::start(config, served, 2).unwrap()
}

/// POST `body` to `route`: the status and the body as text.
pub fn post_text(server: &BackgroundPolicyServer, route: &str, body: &Value) -> (u16, String) {
    let resp = reqwest::blocking::Client::new()
        .post(format!("{}{route}", server.base_url()))
        .json(body)
        .send()
        .unwrap();
    (resp.status().as_u16(), resp.text().unwrap())
}
