//! The configuration reference: every section and key of [`TrainConfig`]
//! with its type, default and doc comment, rendered as Markdown
//! (`agentrl config --reference`, committed as `docs/src/config.md`).
//!
//! The keys, types and descriptions come from the JSON Schema that
//! `schemars` derives from the config structs and their doc comments, so a
//! key added to any section appears here without further work. Defaults are
//! the values a config that leaves the key out actually gets: the resolved
//! minimal config ([`MINIMAL_CONFIG`]) read back, falling back to the
//! schema's own default where the resolved config leaves a key out.

use serde_json::{Map, Value};

use crate::config::{ConfigError, TrainConfig};

/// The smallest valid config: `[env] name` is the only required key. Its
/// resolved values are the defaults the reference lists.
pub const MINIMAL_CONFIG: &str = "[env]\nname = \"frozenlake\"\n";

/// The command that prints [`reference_markdown`], named in the page and in
/// the test that keeps `docs/src/config.md` equal to it.
pub const REGENERATE: &str = "cargo run -p agentrl -- config --reference > docs/src/config.md";

/// The whole reference as Markdown.
pub fn reference_markdown() -> Result<String, ConfigError> {
    Ok(Reference::new()?.render())
}

/// Every key (`section.key`) without a doc comment: the reference would
/// have nothing to say about it.
pub fn undocumented_keys() -> Result<Vec<String>, ConfigError> {
    let r = Reference::new()?;
    let mut missing = Vec::new();
    for section in r.sections() {
        for key in &section.keys {
            if key.description.is_empty() {
                missing.push(format!("{}{}", section.prefix, key.name));
            }
        }
    }
    Ok(missing)
}

/// The schema with its definitions, the resolved minimal config, and the
/// keys [`MINIMAL_CONFIG`] sets (the required ones).
struct Reference {
    root: Value,
    defaults: Value,
    minimal: toml::Table,
}

/// Whether a config must set a key.
#[derive(Clone, Copy)]
enum Required {
    /// The minimal config sets it: no config can leave it out.
    Yes,
    /// The schema requires it, but the resolved config has a value for it
    /// (the tiny model's shape, which `[model]` fills in).
    IfNoDefault,
    No,
}

/// One `[section]` (or `[[section]]`) and its keys.
struct Section {
    /// `[actor]`, `[[mixture]]`, `[env.data_idx]`; empty for the top level.
    title: String,
    /// `actor.`, `env.data_idx.`; what a key's name is written after on the
    /// command line.
    prefix: String,
    description: String,
    keys: Vec<Key>,
}

struct Key {
    name: String,
    ty: String,
    default: String,
    description: String,
}

impl Reference {
    fn new() -> Result<Self, ConfigError> {
        let root = schemars::schema_for!(TrainConfig).to_value();
        let cfg = TrainConfig::from_toml(MINIMAL_CONFIG, &[])?;
        let defaults =
            serde_json::to_value(&cfg).map_err(|e| ConfigError::Render(e.to_string()))?;
        let minimal = MINIMAL_CONFIG
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::Syntax(e.to_string()))?;
        Ok(Self {
            root,
            defaults,
            minimal,
        })
    }

    /// `dotted` (`env.name`) is required when the minimal config has to set
    /// it; a key the schema requires but the config fills in is not.
    fn required(&self, dotted: &str, in_schema: bool) -> Required {
        let mut value: Option<&toml::Value> = None;
        let mut table = Some(&self.minimal);
        for part in dotted.split('.') {
            value = table.and_then(|t| t.get(part));
            table = value.and_then(toml::Value::as_table);
        }
        match (value.is_some(), in_schema) {
            (true, _) => Required::Yes,
            (false, true) => Required::IfNoDefault,
            (false, false) => Required::No,
        }
    }

    /// `#/$defs/Name` → its schema; any other schema as it is.
    fn resolve<'a>(&'a self, schema: &'a Value) -> &'a Value {
        let mut s = schema;
        // A bounded walk: a definition that names itself would loop.
        for _ in 0..8 {
            match s.get("$ref").and_then(Value::as_str) {
                Some(r) => match r
                    .strip_prefix("#/$defs/")
                    .and_then(|name| self.root.get("$defs")?.get(name))
                {
                    Some(def) => s = def,
                    None => return s,
                },
                None => return s,
            }
        }
        s
    }

    /// The object schema (with `properties`) that `schema` stands for, also
    /// through an optional (`anyOf [T, null]`), if it is one.
    fn as_table<'a>(&'a self, schema: &'a Value) -> Option<&'a Value> {
        let s = self.resolve(schema);
        if s.get("properties").is_some() {
            return Some(s);
        }
        let alternatives = s.get("anyOf").and_then(Value::as_array)?;
        let mut tables = alternatives
            .iter()
            .filter(|a| a.get("type").and_then(Value::as_str) != Some("null"));
        let only = tables.next()?;
        if tables.next().is_some() {
            return None;
        }
        self.as_table(only)
    }

    fn sections(&self) -> Vec<Section> {
        let mut top = Section {
            title: String::new(),
            prefix: String::new(),
            description: String::new(),
            keys: Vec::new(),
        };
        let mut out = Vec::new();
        let required = required_of(&self.root);
        for (name, prop) in properties(&self.root) {
            let default = self.defaults.get(name);
            if let Some(table) = self.as_table(prop) {
                self.collect(
                    &mut out,
                    format!("[{name}]"),
                    format!("{name}."),
                    &description_of(prop, table),
                    table,
                    default,
                );
            } else if let Some(items) = self.array_of_tables(prop) {
                self.collect(
                    &mut out,
                    format!("[[{name}]]"),
                    // Written inside each `[[name]]` table, not as overrides.
                    String::new(),
                    &description_of(prop, items),
                    items,
                    None,
                );
            } else {
                let required = self.required(name, required.contains(&name));
                top.keys.push(self.key(name, prop, default, required));
            }
        }
        out.insert(0, top);
        out
    }

    /// The item schema of an array of tables (`[[mixture]]`).
    fn array_of_tables<'a>(&'a self, schema: &'a Value) -> Option<&'a Value> {
        let s = self.resolve(schema);
        if s.get("type").and_then(Value::as_str) != Some("array") {
            return None;
        }
        self.as_table(s.get("items")?)
    }

    /// A section and, after it, the sections of its sub-tables.
    fn collect(
        &self,
        out: &mut Vec<Section>,
        title: String,
        prefix: String,
        description: &str,
        table: &Value,
        defaults: Option<&Value>,
    ) {
        let required = required_of(table);
        let mut section = Section {
            title,
            prefix: prefix.clone(),
            description: description.to_string(),
            keys: Vec::new(),
        };
        let mut subsections = Vec::new();
        for (name, prop) in properties(table) {
            let default = defaults.and_then(|d| d.get(name));
            match self.as_table(prop) {
                Some(sub) => subsections.push((name, prop, sub, default)),
                None => {
                    let required =
                        self.required(&format!("{prefix}{name}"), required.contains(&name));
                    section.keys.push(self.key(name, prop, default, required));
                }
            }
        }
        out.push(section);
        for (name, prop, sub, default) in subsections {
            self.collect(
                out,
                format!("[{prefix}{name}]"),
                format!("{prefix}{name}."),
                &description_of(prop, sub),
                sub,
                default,
            );
        }
    }

    fn key(&self, name: &str, prop: &Value, resolved: Option<&Value>, required: Required) -> Key {
        let schema = self.resolve(prop);
        let default = match (required, resolved, prop.get("default")) {
            (Required::Yes, _, _) => "required".to_string(),
            (_, Some(v), _) if !v.is_null() => format!("`{}`", inline(v)),
            (_, _, Some(v)) if !v.is_null() => format!("`{}`", inline(v)),
            (Required::IfNoDefault, _, _) => "required".to_string(),
            _ => "unset".to_string(),
        };
        let mut description = description_of(prop, schema);
        let variants = self.variants(schema);
        if variants.iter().any(|(_, doc)| !doc.is_empty()) {
            let list: Vec<String> = variants
                .iter()
                .map(|(v, doc)| match doc.is_empty() {
                    true => format!("`{v}`"),
                    false => format!("`{v}`: {}", doc.trim_end_matches('.')),
                })
                .collect();
            if !description.is_empty() {
                description.push(' ');
            }
            description.push_str(&format!("One of {}.", list.join("; ")));
        }
        Key {
            name: name.to_string(),
            ty: self.type_name(prop),
            default,
            description,
        }
    }

    /// An enum's values and their doc comments (empty when not an enum).
    fn variants(&self, schema: &Value) -> Vec<(String, String)> {
        let schema = self.resolve(schema);
        if let Some(values) = schema.get("enum").and_then(Value::as_array) {
            return values.iter().map(|v| (plain(v), String::new())).collect();
        }
        let Some(alts) = schema.get("oneOf").and_then(Value::as_array) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for alt in alts {
            let doc = clean_doc(alt.get("description").and_then(Value::as_str).unwrap_or(""));
            if let Some(c) = alt.get("const") {
                out.push((plain(c), doc));
            } else if let Some(values) = alt.get("enum").and_then(Value::as_array) {
                out.extend(values.iter().map(|v| (plain(v), doc.clone())));
            } else {
                return Vec::new();
            }
        }
        out
    }

    /// A short type: `integer`, `number`, `string`, `boolean`, `table`,
    /// `array of T`, an enum's values, with `, optional` for `Option`.
    fn type_name(&self, schema: &Value) -> String {
        let schema = self.resolve(schema);
        let variants = self.variants(schema);
        if !variants.is_empty() {
            return variants
                .iter()
                .map(|(v, _)| format!("`{v}`"))
                .collect::<Vec<_>>()
                .join(" \\| ");
        }
        if let Some(alts) = schema.get("anyOf").and_then(Value::as_array) {
            let (nulls, others): (Vec<&Value>, Vec<&Value>) = alts
                .iter()
                .partition(|a| a.get("type").and_then(Value::as_str) == Some("null"));
            let names: Vec<String> = others.iter().map(|a| self.type_name(a)).collect();
            let joined = names.join(" or ");
            return match nulls.is_empty() {
                true => joined,
                false => format!("{joined}, optional"),
            };
        }
        let types: Vec<&str> = match schema.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        let optional = types.contains(&"null");
        let base: Vec<String> = types
            .iter()
            .filter(|t| **t != "null")
            .map(|t| match *t {
                "array" => self.array_name(schema),
                "object" => "table".to_string(),
                other => other.to_string(),
            })
            .collect();
        let base = if base.is_empty() {
            "any".to_string()
        } else {
            base.join(" or ")
        };
        match optional {
            true => format!("{base}, optional"),
            false => base,
        }
    }

    fn array_name(&self, schema: &Value) -> String {
        if let Some(items) = schema.get("prefixItems").and_then(Value::as_array) {
            let names: Vec<String> = items.iter().map(|i| self.type_name(i)).collect();
            return format!("[{}]", names.join(", "));
        }
        match schema.get("items") {
            Some(items) => format!("array of {}", self.type_name(items)),
            None => "array".to_string(),
        }
    }

    fn render(&self) -> String {
        let sections = self.sections();
        let mut md = String::new();
        md.push_str("# Configuration reference\n\n");
        md.push_str(
            "Every section and key of a training config, with its type, its default \
             (what a config that leaves the key out gets) and what it does. A config \
             is TOML; any key can also be set on the command line as \
             `section.key=value` after the config file \
             (`agentrl train configs/sokoban.toml actor.lr=1e-4`), and \
             `agentrl train CONFIG --print-config` prints the resolved whole. \
             A misspelt key or a value out of range is an error naming the key, \
             before any work starts.\n\n",
        );
        md.push_str(&format!(
            "This page is generated from the code's doc comments by \
             `agentrl config --reference`; regenerate it with\n\n```sh\n{REGENERATE}\n```\n\n"
        ));
        md.push_str("Sections: ");
        let titles: Vec<String> = sections
            .iter()
            .filter(|s| !s.title.is_empty())
            .map(|s| format!("`{}`", s.title))
            .collect();
        md.push_str(&titles.join(", "));
        md.push_str(".\n");
        for s in &sections {
            md.push('\n');
            match s.title.is_empty() {
                true => md.push_str("## Top level\n\n"),
                false => md.push_str(&format!("## `{}`\n\n", s.title)),
            }
            if !s.description.is_empty() {
                md.push_str(&s.description);
                md.push_str("\n\n");
            }
            md.push_str("| key | type | default | description |\n|---|---|---|---|\n");
            for k in &s.keys {
                md.push_str(&format!(
                    "| `{}{}` | {} | {} | {} |\n",
                    s.prefix,
                    k.name,
                    k.ty,
                    escape_cell(&k.default),
                    escape_cell(&k.description)
                ));
            }
        }
        md
    }
}

/// An object schema's properties, in the schema's (alphabetical) order.
fn properties(schema: &Value) -> Vec<(&str, &Value)> {
    schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|m: &Map<String, Value>| m.iter().map(|(k, v)| (k.as_str(), v)).collect())
        .unwrap_or_default()
}

fn required_of(schema: &Value) -> Vec<&str> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The field's doc comment, else its type's.
fn description_of(prop: &Value, resolved: &Value) -> String {
    let doc = prop
        .get("description")
        .or_else(|| resolved.get("description"))
        .and_then(Value::as_str)
        .unwrap_or("");
    clean_doc(doc)
}

/// A doc comment as one paragraph of Markdown: lines joined, rustdoc's
/// intra-doc links (``[`Env::perception`]``) turned into plain code spans.
fn clean_doc(doc: &str) -> String {
    let joined = doc
        .split("\n\n")
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    strip_doc_links(&joined)
}

/// ``[`x`]`` → `` `x` `` where no `(url)` follows (a rustdoc link).
fn strip_doc_links(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find("[`") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        match after.find("`]") {
            Some(end) if !after[end + 2..].starts_with('(') => {
                out.push_str(&after[..end + 1]);
                rest = &after[end + 2..];
            }
            _ => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A value as one would write it in the TOML: strings quoted, arrays and
/// tables inline.
fn inline(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(inline).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, v)| format!("{k} = {}", inline(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Value::Number(n) => match n.as_f64() {
            // An f32 field's default reaches the schema widened to f64
            // (0.28 as 0.2800000011920929): print the f32 it was when that
            // is the shorter, exact form.
            Some(f) if !(n.is_i64() || n.is_u64()) && (f as f32) as f64 == f => {
                let short = format!("{:?}", f as f32);
                let long = n.to_string();
                if short.len() < long.len() {
                    short
                } else {
                    long
                }
            }
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// An enum value without JSON's quotes.
fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Table cells: a `|` would end the cell.
fn escape_cell(s: &str) -> String {
    s.replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_config_md_is_the_generated_reference() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/src/config.md");
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        let generated = reference_markdown().expect("the reference renders");
        let first_difference = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .map(|i| format!("first difference at line {}", i + 1))
            .unwrap_or_else(|| "one is a prefix of the other".to_string());
        assert!(
            committed == generated,
            "docs/src/config.md is not the output of `agentrl config --reference` \
             ({first_difference}); regenerate it with\n    {REGENERATE}"
        );
    }

    #[test]
    fn every_config_key_has_a_doc_comment() {
        let missing = undocumented_keys().expect("the reference renders");
        assert!(
            missing.is_empty(),
            "config keys without a doc comment (it is the key's entry in docs/src/config.md): {missing:?}"
        );
    }

    #[test]
    fn doc_links_become_code_spans_and_urls_stay() {
        assert_eq!(
            strip_doc_links("see [`Env::perception`] and [`x`](http://a)"),
            "see `Env::perception` and [`x`](http://a)"
        );
    }

    #[test]
    fn f32_defaults_print_as_written() {
        assert_eq!(inline(&serde_json::json!(0.28f32)), "0.28");
        assert_eq!(inline(&serde_json::json!(-0.1f32)), "-0.1");
        assert_eq!(inline(&serde_json::json!(1e-8f64)), "1e-8");
        assert_eq!(inline(&serde_json::json!(3.0f64)), "3.0");
        assert_eq!(inline(&serde_json::json!(512u64)), "512");
    }

    #[test]
    fn doc_paragraphs_join_into_one_line() {
        assert_eq!(clean_doc("a\nb\n\nc  d"), "a b c d");
    }

    #[test]
    fn every_section_of_the_config_has_keys_with_types() {
        let sections = Reference::new()
            .expect("the minimal config is valid")
            .sections();
        let titles: Vec<&str> = sections.iter().map(|s| s.title.as_str()).collect();
        for want in [
            "[actor]",
            "[algorithm]",
            "[env]",
            "[env.data_idx]",
            "[[mixture]]",
            "[model]",
            "[rollout]",
            "[trainer]",
        ] {
            assert!(titles.contains(&want), "{want} missing from {titles:?}");
        }
        for s in &sections {
            for k in &s.keys {
                assert!(!k.ty.is_empty(), "{}{} has no type", s.prefix, k.name);
            }
        }
    }

    #[test]
    fn defaults_are_what_a_config_without_the_key_gets() {
        let md = reference_markdown().expect("renders");
        // The tiny model's width comes from the resolved config, not from
        // a schema default (ModelConfig has none for it).
        assert!(
            md.contains("| `model.hidden_size` | integer | `128` |"),
            "{md}"
        );
        assert!(md.contains("| `env.name` | string | required |"), "{md}");
        assert!(
            md.contains("| `rollout.history_turns` | integer, optional | unset |"),
            "{md}"
        );
    }
}
