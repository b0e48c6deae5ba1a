//! Hugging Face chat templates rendered with `minijinja`.
//!
//! A Hugging Face checkpoint ships its prompt format as a Jinja template in
//! `tokenizer_config.json` (`chat_template`). transformers renders it with
//! Jinja2 in a sandbox configured with `trim_blocks`, `lstrip_blocks`, the
//! `loopcontrols` extension, a `raise_exception` function, a `strftime_now`
//! function and a `tojson` filter that behaves like Python's `json.dumps`.
//! This module reproduces that environment so that the same template gives the
//! same text here as in transformers, byte for byte.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error as JinjaError, ErrorKind};
use serde::{Deserialize, Serialize};

/// One chat message: `{"role": "user", "content": "…"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` (or any role the template accepts).
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A `system` message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    /// A `user` message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// An `assistant` message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// The ChatML template (`<|im_start|>role\ncontent<|im_end|>\n` per message,
/// then `<|im_start|>assistant\n` as the generation prompt) that Qwen2 models
/// use. Unlike Qwen2-Instruct's own copy it does not insert a default system
/// prompt when the chat has none, so a rendered chat is exactly the ChatML
/// token layout the rollout builds message by message.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Why a chat template could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The template source does not parse.
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    /// Rendering failed: an unsupported construct, a type error, or the
    /// template called `raise_exception` (its message is included).
    #[error("chat template failed to render: {0}")]
    Render(String),
}

/// The special-token strings a template may refer to (`bos_token`,
/// `eos_token`, `pad_token`, `unk_token`); `None` renders as Jinja's `none`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TemplateTokens {
    /// `bos_token`.
    pub bos: Option<String>,
    /// `eos_token`.
    pub eos: Option<String>,
    /// `pad_token`.
    pub pad: Option<String>,
    /// `unk_token`.
    pub unk: Option<String>,
}

/// A compiled chat template.
pub struct ChatTemplate {
    source: String,
    env: Environment<'static>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl Clone for ChatTemplate {
    fn clone(&self) -> Self {
        // The source compiled once already, so compiling it again cannot fail;
        // fall back to an environment without the template rather than panic.
        Self::new(self.source.clone()).unwrap_or_else(|_| Self {
            source: self.source.clone(),
            env: environment(),
        })
    }
}

const TEMPLATE_NAME: &str = "chat_template";

/// The Jinja environment transformers uses for chat templates.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    // transformers: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env
}

impl ChatTemplate {
    /// Compile a template; a syntax error names the line.
    pub fn new(source: impl Into<String>) -> Result<Self, TemplateError> {
        let source = source.into();
        let mut env = environment();
        env.add_template_owned(TEMPLATE_NAME, strip_generation_tags(&source))
            .map_err(|e| TemplateError::Syntax(describe(&e)))?;
        Ok(Self { source, env })
    }

    /// The template source as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Render `messages` as transformers' `apply_chat_template(…,
    /// tokenize=False)` does, with `tools` and `documents` set to none.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tokens: &TemplateTokens,
    ) -> Result<String, TemplateError> {
        self.render_values(
            Value::from_serialize(messages),
            Value::from(()),
            add_generation_prompt,
            tokens,
        )
    }

    /// Render messages given as JSON objects (an assistant message's
    /// `tool_calls`, a tool message's `tool_call_id`, as OpenAI clients send
    /// them) with `tools` (JSON schemas of functions, none when `None`), as
    /// transformers' `apply_chat_template(messages, tools=tools, …)` does.
    pub fn render_with_tools(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
        tokens: &TemplateTokens,
    ) -> Result<String, TemplateError> {
        // Keys in a tool schema's usual order (serde_json's maps are sorted).
        let ordered = |v: &[serde_json::Value]| {
            Value::from_serialize(v.iter().map(crate::tools::Ordered).collect::<Vec<_>>())
        };
        let tools = match tools {
            Some(t) => ordered(t),
            None => Value::from(()),
        };
        self.render_values(ordered(messages), tools, add_generation_prompt, tokens)
    }

    /// Whether the template reads `tools` (Qwen2.5's has a tools section;
    /// a plain ChatML template does not).
    pub fn reads_tools(&self) -> bool {
        self.source.contains("tools")
    }

    fn render_values(
        &self,
        messages: Value,
        tools: Value,
        add_generation_prompt: bool,
        tokens: &TemplateTokens,
    ) -> Result<String, TemplateError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TemplateError::Render(describe(&e)))?;
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => tokens.bos.clone(),
            eos_token => tokens.eos.clone(),
            pad_token => tokens.pad.clone(),
            unk_token => tokens.unk.clone(),
            tools => tools,
            documents => Value::from(()),
        };
        template
            .render(ctx)
            .map_err(|e| TemplateError::Render(describe(&e)))
    }
}

/// minijinja's error with its cause chain and, where known, the line.
fn describe(e: &JinjaError) -> String {
    let mut out = e.to_string();
    if let Some(line) = e.line() {
        if !out.contains("line") {
            out.push_str(&format!(" (line {line})"));
        }
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        out.push_str(&format!(": {s}"));
        source = s.source();
    }
    out
}

/// transformers' `{% generation %}…{% endgeneration %}` block only marks the
/// assistant's tokens for a mask; its content renders unchanged, so dropping
/// the two tags gives the same text (minijinja has no custom tags).
fn strip_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("%}") else {
            break;
        };
        let inner = after[..end].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        out.push_str(&rest[..start]);
        if inner != "generation" && inner != "endgeneration" {
            out.push_str(&rest[start..start + 2 + end + 2]);
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

/// `raise_exception(msg)`: the template rejects its input.
fn raise_exception(msg: String) -> Result<Value, JinjaError> {
    Err(JinjaError::new(
        ErrorKind::InvalidOperation,
        format!("raise_exception: {msg}"),
    ))
}

/// `strftime_now(format)`: the current UTC time (Llama 3 templates print the
/// date). Supports `%Y %y %m %d %e %B %b %A %a %H %M %S %j %%`.
fn strftime_now(format: String) -> Result<Value, JinjaError> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Ok(Value::from(format_utc(secs, &format)))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Format a Unix time (UTC) with a subset of C's strftime.
fn format_utc(secs: u64, format: &str) -> String {
    let days = (secs / 86_400) as i64;
    let sod = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    // 1970-01-01 was a Thursday (index 3 with Monday = 0).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let cumulative = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let m0 = (month - 1) as usize;
    let yday = cumulative[m0] + day + i64::from(leap && month > 2);
    let month_name = MONTHS[m0];
    let weekday_name = WEEKDAYS[weekday];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:2}")),
            Some('B') => out.push_str(month_name),
            Some('b') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(weekday_name),
            Some('a') => out.push_str(&weekday_name[..3]),
            Some('H') => out.push_str(&format!("{:02}", sod / 3600)),
            Some('M') => out.push_str(&format!("{:02}", sod / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", sod % 60)),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False,
/// indent=indent, separators=separators, sort_keys=sort_keys)`. minijinja's
/// own `tojson` escapes `<`, `>`, `&` and `'` for HTML and uses compact
/// separators, which would change the prompt text.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, JinjaError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(JinjaError::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair",
            ))
        }
        // Python's defaults: (', ', ': ') without indent, (',', ': ') with it.
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let style = PyJsonStyle {
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    style.write(&value, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

struct PyJsonStyle {
    indent: Option<usize>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl PyJsonStyle {
    fn newline(&self, depth: usize, out: &mut String) {
        if let Some(width) = self.indent {
            out.push('\n');
            out.push_str(&" ".repeat(width * depth));
        }
    }

    /// Walks the template value itself (not a serde_json copy) so that maps
    /// keep their insertion order, as Python dicts do.
    fn write(&self, v: &Value, depth: usize, out: &mut String) -> Result<(), JinjaError> {
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => {
                let json = serde_json::to_value(v).map_err(not_serialisable)?;
                out.push_str(&json.to_string());
            }
            // Escaped as Python's json with ensure_ascii=False: only `"`, `\`
            // and control characters (serde_json does the same).
            ValueKind::String => {
                out.push_str(&serde_json::Value::String(v.to_string()).to_string())
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(depth + 1, out);
                    self.write(item, depth + 1, out)?;
                }
                self.newline(depth, out);
                out.push(']');
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if keys.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                if self.sort_keys {
                    keys.sort();
                }
                out.push('{');
                for (i, key) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(depth + 1, out);
                    let item = v.get_item(key)?;
                    out.push_str(&serde_json::Value::String(key.to_string()).to_string());
                    out.push_str(&self.key_sep);
                    self.write(&item, depth + 1, out)?;
                }
                self.newline(depth, out);
                out.push('}');
            }
            _ => {
                let json = serde_json::to_value(v).map_err(not_serialisable)?;
                out.push_str(&json.to_string());
            }
        }
        Ok(())
    }
}

fn not_serialisable(e: serde_json::Error) -> JinjaError {
    JinjaError::new(
        ErrorKind::InvalidOperation,
        format!("tojson: value is not JSON serialisable: {e}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_are_dropped_but_their_body_kept() {
        let src = "a{% generation %}b{%- endgeneration -%}c{% if x %}d{% endif %}";
        assert_eq!(strip_generation_tags(src), "abc{% if x %}d{% endif %}");
    }

    #[test]
    fn utc_formatting_matches_known_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        assert_eq!(
            format_utc(1_709_211_909, "%d %b %Y %H:%M:%S %A %j %%"),
            "29 Feb 2024 13:05:09 Thursday 060 %"
        );
        assert_eq!(format_utc(0, "%Y-%m-%d %a"), "1970-01-01 Thu");
    }
}
