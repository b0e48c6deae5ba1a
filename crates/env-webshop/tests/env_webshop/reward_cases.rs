//! The reward's option and attribute terms against WebShop's own code: every
//! case in `data/reward_cases.json` was scored by WebShop's `engine/goal.py`
//! (thefuzz, its `normalize_color`) with `scripts/webshop/reward_cases.py`.

use agentrl_env_webshop::catalog::Product;
use agentrl_env_webshop::reward::{attribute_matches, option_matches};
use serde_json::Value;

/// The cases of one kind (`options`, `attributes`): at least `min` of them.
fn cases(kind: &str, min: usize) -> Vec<Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/reward_cases.json");
    let all: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = all[kind].as_array().unwrap().clone();
    assert!(cases.len() >= min, "{kind}: {} cases", cases.len());
    cases
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn option_matches_agree_with_webshop() {
    for case in cases("options", 300) {
        let goal: Vec<(String, String)> = case["goal"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                let p = strings(p);
                (p[0].clone(), p[1].clone())
            })
            .collect();
        let got = option_matches(&strings(&case["chosen"]), &goal);
        assert_eq!(got as u64, case["matches"].as_u64().unwrap(), "{case}");
    }
}

#[test]
fn attribute_matches_agree_with_webshop() {
    for case in cases("attributes", 150) {
        let p = &case["product"];
        let product = Product {
            asin: "B000000000".into(),
            title: p["Title"].as_str().unwrap().into(),
            category: String::new(),
            query: String::new(),
            product_category: String::new(),
            description: p["Description"].as_str().unwrap().into(),
            bullet_points: strings(&p["BulletPoints"]),
            attributes: strings(&p["Attributes"]),
            options: Vec::new(),
            price: 0.0,
        };
        let got = attribute_matches(&product, &strings(&case["goal"]));
        assert_eq!(got as u64, case["matches"].as_u64().unwrap(), "{case}");
    }
}
