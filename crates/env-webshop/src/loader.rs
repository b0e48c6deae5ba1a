//! Loads WebShop's own data files from a directory:
//! - `items_shuffle*.json`: the products, a list of `{asin, name, category,
//!   query, product_category, full_description, small_description, pricing,
//!   customization_options: {name: [{value, …}]}, …}`;
//! - `items_ins_v2*.json`: asin → `{attributes, instruction?, instruction_attributes?}`;
//! - `items_human_ins*.json` (optional): asin → list of `{instruction,
//!   instruction_attributes, instruction_options, …}`.
//!
//! Field handling follows WebShop's `engine.load_products`: duplicate or
//! malformed ASINs are skipped, option values are lower-cased with "/" turned
//! into " | ", a product with no `attributes` key gets `DUMMY_ATTR`, a missing price
//! is $100. Where WebShop draws a price inside a range with Python's RNG we
//! draw it from a generator seeded by the ASIN (same price on every machine).

use std::path::{Path, PathBuf};

use agentrl_env_core::{stable_hash, EnvError};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

use crate::catalog::Product;

/// A goal template from the files; options and the price ceiling are drawn per task.
#[derive(Debug, Clone, PartialEq)]
pub struct GoalTemplate {
    /// Index of the target product in the loaded product list.
    pub product: usize,
    pub instruction: String,
    pub attributes: Vec<String>,
    /// Fixed options (human goals); `None` = draw one value per option group (synthetic goals).
    pub options: Option<Vec<(String, String)>>,
}

/// Products and goal templates loaded from a WebShop data directory.
#[derive(Debug, Clone)]
pub struct LoadedData {
    pub products: Vec<Product>,
    pub goals: Vec<GoalTemplate>,
}

/// Which instructions to use (the `goals` parameter: `auto`, `human`, `synthetic`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GoalSource {
    /// Human instructions if the file exists, else synthetic.
    #[default]
    Auto,
    Human,
    Synthetic,
}

fn data_err(path: &Path, reason: impl Into<String>) -> EnvError {
    EnvError::Data {
        env: "webshop".into(),
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

/// The first file (sorted by name) in `dir` whose name starts with `prefix` and ends with `.json`.
fn find_file(dir: &Path, prefix: &str) -> Result<Option<PathBuf>, EnvError> {
    let entries = std::fs::read_dir(dir).map_err(|e| data_err(dir, e.to_string()))?;
    let mut names: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".json"))
        })
        .collect();
    names.sort();
    Ok(names.into_iter().next())
}

fn read_json(path: &Path) -> Result<Value, EnvError> {
    let text = std::fs::read_to_string(path).map_err(|e| data_err(path, e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| data_err(path, format!("invalid JSON: {e}")))
}

fn str_field(v: &Value, key: &str) -> String {
    match v.get(key) {
        Some(Value::String(s)) => s.clone(),
        _ => String::new(),
    }
}

fn str_list(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_str().map(|s| s.to_string()))
            .collect(),
        Some(Value::String(s)) if !s.is_empty() => vec![s.clone()],
        _ => Vec::new(),
    }
}

/// WebShop's price parsing: every "$…" amount, digits and dots only; none → [100.0].
pub fn parse_pricing(pricing: &str) -> Vec<f64> {
    let amounts: Vec<f64> = pricing
        .split('$')
        .skip(1)
        .filter_map(|p| {
            let digits: String = p
                .chars()
                .filter(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            digits.parse::<f64>().ok()
        })
        .collect();
    if amounts.is_empty() {
        vec![100.0]
    } else {
        amounts.into_iter().take(2).collect()
    }
}

/// Load a WebShop data directory.
pub fn load_dir(dir: &Path, source: GoalSource) -> Result<LoadedData, EnvError> {
    let products_path = find_file(dir, "items_shuffle")?.ok_or_else(|| {
        data_err(
            dir,
            "no items_shuffle*.json (WebShop's product file) in this directory",
        )
    })?;
    let attrs_path = find_file(dir, "items_ins_v2")?;
    let human_path = find_file(dir, "items_human_ins")?;

    let raw = read_json(&products_path)?;
    let list = raw
        .as_array()
        .ok_or_else(|| data_err(&products_path, "expected a JSON list of products"))?;
    let attrs = match &attrs_path {
        Some(p) => read_json(p)?,
        None => Value::Object(Default::default()),
    };
    let human = match (&human_path, source) {
        (_, GoalSource::Synthetic) => None,
        (Some(p), _) => Some(read_json(p)?),
        (None, GoalSource::Human) => {
            return Err(data_err(
                dir,
                "goals = \"human\" but no items_human_ins*.json found",
            ))
        }
        (None, GoalSource::Auto) => None,
    };

    let mut seen = std::collections::BTreeSet::new();
    let mut products = Vec::new();
    let mut goals = Vec::new();
    for p in list {
        let asin = str_field(p, "asin");
        if asin.is_empty() || asin == "nan" || asin.len() > 10 || !seen.insert(asin.clone()) {
            continue;
        }
        let pricing = parse_pricing(&str_field(p, "pricing"));
        let price = if pricing.len() >= 2 {
            let (lo, hi) = (pricing[0].min(pricing[1]), pricing[0].max(pricing[1]));
            let mut rng = ChaCha8Rng::seed_from_u64(stable_hash(&[asin.as_bytes()]));
            let x: f64 = if hi > lo {
                rng.random_range(lo..hi)
            } else {
                lo
            };
            (x * 100.0).round() / 100.0
        } else {
            pricing[0]
        };
        let mut options: Vec<(String, Vec<String>)> = Vec::new();
        if let Some(Value::Object(custom)) = p.get("customization_options") {
            // serde_json keeps keys sorted (no preserve_order): a stable order.
            for (name, contents) in custom {
                let Some(items) = contents.as_array() else {
                    continue;
                };
                let values: Vec<String> = items
                    .iter()
                    .filter_map(|c| c.get("value").and_then(|v| v.as_str()))
                    .map(|v| v.trim().replace('/', " | ").to_lowercase())
                    .collect();
                options.push((name.to_lowercase(), values));
            }
        }
        let attr_entry = attrs.get(&asin);
        // As WebShop: DUMMY_ATTR only when the key is missing; an explicit
        // empty list stays empty.
        let attributes = match attr_entry.and_then(|a| a.get("attributes")) {
            Some(list) => str_list(Some(list)),
            None => vec!["DUMMY_ATTR".to_string()],
        };
        let idx = products.len();
        products.push(Product {
            asin: asin.clone(),
            title: str_field(p, "name"),
            category: str_field(p, "category"),
            query: str_field(p, "query").to_lowercase().trim().to_string(),
            product_category: str_field(p, "product_category"),
            description: str_field(p, "full_description"),
            bullet_points: str_list(p.get("small_description")),
            attributes,
            options,
            price,
        });
        match &human {
            Some(h) => {
                if let Some(Value::Array(list)) = h.get(&asin) {
                    for ins in list {
                        let attributes = str_list(ins.get("instruction_attributes"));
                        // WebShop skips human goals without attributes.
                        if attributes.is_empty() {
                            continue;
                        }
                        let options = match ins.get("instruction_options") {
                            Some(Value::Object(m)) => m
                                .iter()
                                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                                .collect(),
                            Some(Value::Array(a)) => a
                                .iter()
                                .filter_map(|v| v.as_str().map(|v| (String::new(), v.to_string())))
                                .collect(),
                            _ => Vec::new(),
                        };
                        goals.push(GoalTemplate {
                            product: idx,
                            instruction: str_field(ins, "instruction")
                                .trim_end_matches('.')
                                .trim()
                                .to_string(),
                            attributes,
                            options: Some(options),
                        });
                    }
                }
            }
            None => {
                if let Some(entry) = attr_entry {
                    let instruction = str_field(entry, "instruction");
                    let attributes = str_list(entry.get("instruction_attributes"));
                    if !instruction.is_empty() && !attributes.is_empty() {
                        goals.push(GoalTemplate {
                            product: idx,
                            instruction,
                            attributes,
                            options: None,
                        });
                    }
                }
            }
        }
    }
    if products.is_empty() {
        return Err(data_err(&products_path, "no usable products"));
    }
    if goals.is_empty() {
        return Err(data_err(
            dir,
            "no goals: need instructions in items_ins_v2*.json or items_human_ins*.json",
        ));
    }
    Ok(LoadedData { products, goals })
}

/// Files with fewer goals than this are too small to split: every split draws
/// from all of them.
pub const MIN_GOALS_TO_SPLIT: usize = 20;

/// The goal templates a split draws from: a stable partition by a hash of
/// (asin, instruction) — 1 in 10 to test, 1 in 10 to validation, the rest to
/// train; tiny files (or an empty partition) use every goal.
pub fn split_goals(
    goals: &[GoalTemplate],
    products: &[Product],
    split: agentrl_env_core::Split,
) -> Vec<usize> {
    let bucket = |g: &GoalTemplate| {
        let asin = products
            .get(g.product)
            .map(|p| p.asin.as_str())
            .unwrap_or("");
        stable_hash(&[asin.as_bytes(), g.instruction.as_bytes()]) % 10
    };
    if goals.len() < MIN_GOALS_TO_SPLIT {
        return (0..goals.len()).collect();
    }
    let chosen: Vec<usize> = (0..goals.len())
        .filter(|&i| match split {
            agentrl_env_core::Split::Test => bucket(&goals[i]) == 0,
            agentrl_env_core::Split::Val => bucket(&goals[i]) == 1,
            agentrl_env_core::Split::Train => bucket(&goals[i]) >= 2,
        })
        .collect();
    if chosen.is_empty() {
        (0..goals.len()).collect()
    } else {
        chosen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// WebShop's `load_products`: `DUMMY_ATTR` only when `attributes` is
    /// missing; an explicit `[]` stays empty.
    #[test]
    fn dummy_attribute_only_when_the_key_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let product = |asin: &str| {
            serde_json::json!({"asin": asin, "name": "Kestrel Coffee", "category": "grocery",
                "query": "coffee", "product_category": "Grocery", "pricing": "$10.00"})
        };
        let products = serde_json::json!([product("B0EMPTY001"), product("B0NOKEY001")]);
        let attrs = serde_json::json!({
            "B0EMPTY001": {"attributes": [], "instruction": "i need coffee",
                "instruction_attributes": ["fresh"]},
            "B0NOKEY001": {"instruction": "i need coffee", "instruction_attributes": ["fresh"]},
        });
        std::fs::write(dir.path().join("items_shuffle.json"), products.to_string()).unwrap();
        std::fs::write(dir.path().join("items_ins_v2.json"), attrs.to_string()).unwrap();
        let data = load_dir(dir.path(), GoalSource::Synthetic).unwrap();
        let attrs_of = |asin: &str| {
            let p = data.products.iter().find(|p| p.asin == asin).unwrap();
            p.attributes.clone()
        };
        assert!(attrs_of("B0EMPTY001").is_empty());
        assert_eq!(attrs_of("B0NOKEY001"), ["DUMMY_ATTR"]);
    }

    #[test]
    fn pricing_parses_like_webshop() {
        assert_eq!(parse_pricing("$12.99"), vec![12.99]);
        assert_eq!(parse_pricing("$74.50 - $89.00"), vec![74.5, 89.0]);
        assert_eq!(parse_pricing(""), vec![100.0]);
        assert_eq!(parse_pricing("$1,299.00"), vec![1299.0]);
    }
}
