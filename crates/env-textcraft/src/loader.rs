//! Loader for the item and recipe files of the `minecraft-data` package
//! (`data/pc/<version>/items.json` and `recipes.json`).
//!
//! - `items.json`: `[{"id": 1, "name": "oak_planks", "displayName": …}, …]`
//! - `recipes.json`: `{"<result id>": [recipe, …]}` where a recipe is either
//!   shaped, `{"inShape": [[id|null, …], …], "result": {"count": n, "id": id}}`,
//!   or shapeless, `{"ingredients": [id, …], "result": {…}}`. Older versions
//!   write ids as `{"id": 5, "metadata": 0}`; both forms are read.
//!
//! Item names become lower-case words (`oak_planks` → `oak planks`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::Value;

use crate::book::{Recipe, RecipeBook};

/// Why a data directory could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {reason}")]
    Io { path: String, reason: String },
    #[error("{file} is not valid JSON: {reason}")]
    Json { file: String, reason: String },
    #[error("{file}: {reason}")]
    Format { file: String, reason: String },
}

/// The display name of a minecraft-data item name.
pub fn display_name(name: &str) -> String {
    let name = name.strip_prefix("minecraft:").unwrap_or(name);
    name.replace('_', " ").to_ascii_lowercase()
}

fn read_json(path: &Path) -> Result<Value, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|e| LoadError::Io {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    serde_json::from_str(&text).map_err(|e| LoadError::Json {
        file: path.display().to_string(),
        reason: e.to_string(),
    })
}

/// An item id as written in a recipe: a number, `{"id": n}`, or (for
/// alternatives) a list whose first entry is used. `null` is an empty slot.
fn ingredient_id(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::Object(o) => o.get("id").and_then(|i| i.as_i64()),
        Value::Array(a) => a.first().and_then(ingredient_id),
        _ => None,
    }
}

/// Load `items.json` and `recipes.json` from `dir` into a recipe book.
///
/// Recipes that name an unknown item id are skipped (minecraft-data lists a
/// few); recipes are read in the file's key order after sorting the result
/// ids numerically, so the book never depends on map or directory order.
pub fn load_dir(dir: &Path) -> Result<RecipeBook, LoadError> {
    let items_file = dir.join("items.json");
    let recipes_file = dir.join("recipes.json");
    let items_v = read_json(&items_file)?;
    let recipes_v = read_json(&recipes_file)?;
    let items_name = items_file.display().to_string();
    let recipes_name = recipes_file.display().to_string();

    let items = items_v.as_array().ok_or_else(|| LoadError::Format {
        file: items_name.clone(),
        reason: "expected a JSON array of items".into(),
    })?;
    let mut names: BTreeMap<i64, String> = BTreeMap::new();
    for (k, it) in items.iter().enumerate() {
        let id = it.get("id").and_then(|v| v.as_i64());
        let name = it.get("name").and_then(|v| v.as_str());
        match (id, name) {
            (Some(id), Some(name)) => {
                names.insert(id, display_name(name));
            }
            _ => {
                return Err(LoadError::Format {
                    file: items_name,
                    reason: format!("item #{k} lacks an integer 'id' or a string 'name'"),
                })
            }
        }
    }

    let table = recipes_v.as_object().ok_or_else(|| LoadError::Format {
        file: recipes_name.clone(),
        reason: "expected a JSON object {resultId: [recipes]}".into(),
    })?;
    let mut keys: Vec<(i64, &String)> = Vec::new();
    for k in table.keys() {
        let id = k.parse::<i64>().map_err(|_| LoadError::Format {
            file: recipes_name.clone(),
            reason: format!("key '{k}' is not an item id"),
        })?;
        keys.push((id, k));
    }
    keys.sort();

    let mut recipes = Vec::new();
    for (_, key) in keys {
        let Some(list) = table[key].as_array() else {
            return Err(LoadError::Format {
                file: recipes_name,
                reason: format!("recipes of '{key}' are not a list"),
            });
        };
        'recipe: for rec in list {
            let Some(result) = rec.get("result") else {
                continue;
            };
            let (Some(out_id), count) = (
                ingredient_id(result),
                result.get("count").and_then(|c| c.as_u64()).unwrap_or(1),
            ) else {
                continue;
            };
            let Some(out_name) = names.get(&out_id) else {
                continue;
            };
            let mut slots: Vec<i64> = Vec::new();
            if let Some(shape) = rec.get("inShape").and_then(|s| s.as_array()) {
                for row in shape {
                    let Some(row) = row.as_array() else {
                        continue 'recipe;
                    };
                    slots.extend(row.iter().filter_map(ingredient_id));
                }
            } else if let Some(ings) = rec.get("ingredients").and_then(|s| s.as_array()) {
                slots.extend(ings.iter().filter_map(ingredient_id));
            } else {
                continue;
            }
            let mut inputs: Vec<(String, u32)> = Vec::new();
            for id in slots {
                let Some(n) = names.get(&id) else {
                    continue 'recipe;
                };
                inputs.push((n.clone(), 1));
            }
            // A recipe that makes an item from itself teaches nothing.
            if inputs.is_empty() || inputs.iter().any(|(n, _)| n == out_name) {
                continue;
            }
            let count = u32::try_from(count.clamp(1, 64)).unwrap_or(1);
            recipes.push(Recipe::new(out_name.clone(), count, &inputs));
        }
    }
    let known: BTreeSet<String> = BTreeSet::new();
    Ok(RecipeBook::build(&known, recipes))
}
