use agentrl_model::tokenizer::ChatTokenizer;
#[test]
fn scratch_dump() {
    let texts: Vec<String> = (0..200).map(|i| format!("<|im_start|>user\nTurn {i}: #######\n#_P_√_#\n#_X_O_# café 東京 Push the box {}<|im_end|>\n", i * 7 % 13)).collect();
    let tok = ChatTokenizer::train_bpe(&texts, 400).unwrap();
    tok.save("/tmp/hfcheck/trained").unwrap();
    let fx = ChatTokenizer::load(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/qwen2-tiny")).unwrap();
    fx.save("/tmp/hfcheck/fixture").unwrap();
    let probes = ["<|im_start|>user\nhello  world 123 √√ naïve<|im_end|>\n", "  x\t\ny don't 2024", "#######\n#_P_√_#"];
    let mut out = serde_json::Map::new();
    for (name, t) in [("trained", &tok), ("fixture", &fx)] {
        let v: Vec<Vec<u32>> = probes.iter().map(|p| t.encode(p).unwrap()).collect();
        out.insert(name.into(), serde_json::json!(v));
        let chat = t.render_chat(&[agentrl_model::ChatMessage::system("S"), agentrl_model::ChatMessage::user("U √")], true).unwrap();
        out.insert(format!("{name}_chat"), serde_json::json!(chat));
    }
    out.insert("probes".into(), serde_json::json!(probes));
    std::fs::write("/tmp/hfcheck/rust.json", serde_json::Value::Object(out).to_string()).unwrap();
}
