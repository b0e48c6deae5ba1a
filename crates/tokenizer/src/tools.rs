//! Tool calling in the Hermes format Qwen2.5 is trained on: a chat's tools
//! described in the system message, the assistant's calls written as
//! `<tool_call>{"name": …, "arguments": …}</tool_call>`, tool results sent
//! back as `<tool_response>…</tool_response>` in a user turn.
//!
//! [`ChatTokenizer::render_chat_with_tools`](crate::ChatTokenizer::render_chat_with_tools)
//! renders tools through the checkpoint's chat template when the template
//! reads `tools` (Qwen2.5's does); for a template that does not (plain
//! ChatML, SmolLM2's), [`hermes_messages`] writes the same text into the
//! messages themselves, so any ChatML model sees tools as Qwen2.5 would.
//! [`parse_tool_calls`] reads a reply back as vLLM's `hermes` parser does.

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use serde_json::Value;

/// Opens a tool call in a reply.
pub const TOOL_CALL_START: &str = "<tool_call>";
/// Closes a tool call.
pub const TOOL_CALL_END: &str = "</tool_call>";

/// What Qwen2.5's template writes before the tools' schemas.
const TOOLS_HEAD: &str = "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>";
/// What it writes after them.
const TOOLS_TAIL: &str = "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>";

/// One call the model made: a function's name and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedToolCall {
    /// The function's name.
    pub name: String,
    /// The arguments as the model wrote them (a JSON value, usually an object).
    pub arguments: String,
}

/// A reply read for tool calls: the text before the first call (none when
/// empty) and the calls. A reply without a well-formed call is all content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedReply {
    /// The reply's text before the first `<tool_call>`, or all of it.
    pub content: Option<String>,
    /// The calls, in order; empty when the reply made none.
    pub tool_calls: Vec<ParsedToolCall>,
}

/// Reads `text` as vLLM's `hermes` tool parser does: every
/// `<tool_call>…</tool_call>` (the last one may be unclosed) must hold a
/// JSON object with a string `name` and an `arguments` value; then the calls
/// are returned with the text before the first one as content. If any call
/// is malformed, the whole reply is content and no call is returned.
pub fn parse_tool_calls(text: &str) -> ParsedReply {
    let as_content = || ParsedReply {
        content: Some(text.to_string()),
        tool_calls: Vec::new(),
    };
    let Some(first) = text.find(TOOL_CALL_START) else {
        return as_content();
    };
    let mut calls = Vec::new();
    let mut rest = &text[first..];
    while let Some(at) = rest.find(TOOL_CALL_START) {
        let body = &rest[at + TOOL_CALL_START.len()..];
        let (inner, next) = match body.find(TOOL_CALL_END) {
            Some(end) => (&body[..end], &body[end + TOOL_CALL_END.len()..]),
            None => (body, ""),
        };
        match parse_call(inner) {
            Some(call) => calls.push(call),
            None => return as_content(),
        }
        rest = next;
    }
    let content = &text[..first];
    ParsedReply {
        content: (!content.is_empty()).then(|| content.to_string()),
        tool_calls: calls,
    }
}

/// One call's JSON: `{"name": "...", "arguments": ...}`; the arguments
/// written back as Python's `json.dumps` writes them (vLLM's parser does
/// the same; keys in [`Ordered`]'s order).
fn parse_call(inner: &str) -> Option<ParsedToolCall> {
    let call: Value = serde_json::from_str(inner.trim()).ok()?;
    Some(ParsedToolCall {
        name: call.get("name")?.as_str()?.to_string(),
        arguments: python_json(call.get("arguments")?),
    })
}

/// Messages (OpenAI's JSON shape) with `tools` written into them the way
/// Qwen2.5's template writes them, for a chat template that does not read
/// `tools`: the tools' schemas appended to the system message (one is
/// added first when the chat has none), each assistant `tool_calls` entry
/// as a `<tool_call>` block after its content, and each run of `tool`
/// messages as one user message of `<tool_response>` blocks. Every message
/// comes out as `{"role", "content"}` with text content. Without tools no
/// system text is added (the calls and results are still written out).
pub fn hermes_messages(messages: &[Value], tools: &[Value]) -> Vec<Value> {
    let mut block = String::from(TOOLS_HEAD);
    for tool in tools {
        block.push('\n');
        block.push_str(&python_json(tool));
    }
    block.push_str(TOOLS_TAIL);
    let text = |m: &Value| {
        m.get("content")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let role = |m: &Value| {
        m.get("role")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let mut out: Vec<Value> = Vec::with_capacity(messages.len() + 1);
    let leading_system = messages.first().is_some_and(|m| role(m) == "system");
    match messages.first() {
        _ if tools.is_empty() => {}
        Some(m) if leading_system => out.push(chat("system", format!("{}\n\n{block}", text(m)))),
        _ => out.push(chat("system", block)),
    }
    let skip = usize::from(leading_system && !tools.is_empty());
    let mut after_tool = false;
    for m in &messages[skip..] {
        let r = role(m);
        match r.as_str() {
            "assistant" => {
                let mut content = text(m);
                for call in m
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let f = call.get("function").unwrap_or(call);
                    let name = f.get("name").and_then(Value::as_str).unwrap_or("");
                    let args = f.get("arguments").cloned().unwrap_or(Value::Null);
                    if !content.is_empty() {
                        content.push('\n');
                    }
                    content.push_str(&format!(
                        "{TOOL_CALL_START}\n{{\"name\": {}, \"arguments\": {}}}\n{TOOL_CALL_END}",
                        python_json(&Value::from(name)),
                        python_json(&args)
                    ));
                }
                out.push(chat("assistant", content));
            }
            "tool" => {
                let response = format!("<tool_response>\n{}\n</tool_response>", text(m));
                // A run of tool results is one user turn, as Qwen2.5 writes it.
                match out.last_mut() {
                    Some(prev) if after_tool => {
                        let joined = format!("{}\n{response}", text(prev));
                        prev["content"] = Value::from(joined);
                    }
                    _ => out.push(chat("user", response)),
                }
            }
            other => out.push(chat(other, text(m))),
        }
        after_tool = r == "tool";
    }
    out
}

/// `{"role": role, "content": content}`.
fn chat(role: &str, content: String) -> Value {
    serde_json::json!({ "role": role, "content": content })
}

/// Messages for a template that reads `tools`: as given, but each tool
/// call's `function.arguments` (a JSON string on OpenAI's wire) parsed into
/// the value it holds, as vLLM passes them (templates write it with
/// `tojson`); a string that is not JSON stays as it is.
pub fn template_messages(messages: &[Value]) -> Vec<Value> {
    messages
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) {
                for call in calls {
                    if let Some(args) = call.pointer_mut("/function/arguments") {
                        if let Some(parsed) = args
                            .as_str()
                            .and_then(|s| serde_json::from_str::<Value>(s).ok())
                        {
                            *args = parsed;
                        }
                    }
                }
            }
            m
        })
        .collect()
}

/// `value` as Python's `json.dumps(value, ensure_ascii=False)` writes it
/// (`", "` and `": "` separators), the way the templates' `tojson` does; an
/// object's keys in [`Ordered`]'s order.
pub fn python_json(value: &Value) -> String {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonFormatter);
    // Writing JSON values into memory cannot fail.
    let _ = Ordered(value).serialize(&mut ser);
    String::from_utf8(out).unwrap_or_default()
}

/// serde_json's compact output with Python's separators.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

/// A JSON value serialised with the keys of a tool schema in the order
/// OpenAI's documentation and Qwen's examples write them (`type`,
/// `function`, `name`, `description`, `parameters`, `properties`,
/// `required`), then the rest by name: serde_json's maps are sorted, and the
/// order a client wrote is not kept.
pub struct Ordered<'a>(pub &'a Value);

/// Keys written first, in this order.
const KEY_ORDER: [&str; 8] = [
    "type",
    "function",
    "name",
    "description",
    "parameters",
    "properties",
    "required",
    "arguments",
];

impl Serialize for Ordered<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                let rank = |k: &str| {
                    KEY_ORDER
                        .iter()
                        .position(|&o| o == k)
                        .unwrap_or(KEY_ORDER.len())
                };
                keys.sort_by(|a, b| rank(a).cmp(&rank(b)).then(a.cmp(b)));
                let mut m = s.serialize_map(Some(keys.len()))?;
                for k in keys {
                    m.serialize_entry(k, &Ordered(&map[k.as_str()]))?;
                }
                m.end()
            }
            Value::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(&Ordered(item))?;
                }
                seq.end()
            }
            other => other.serialize(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn calls_are_read_as_vllms_hermes_parser_reads_them() {
        let r = parse_tool_calls(
            "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"now\", \"arguments\": {}}",
        );
        assert_eq!(r.content.as_deref(), Some("Let me look.\n"));
        assert_eq!(
            r.tool_calls,
            vec![
                ParsedToolCall {
                    name: "get_weather".into(),
                    arguments: "{\"city\": \"Paris\"}".into()
                },
                ParsedToolCall {
                    name: "now".into(),
                    arguments: "{}".into()
                },
            ]
        );
        // No content before the call: none.
        let r = parse_tool_calls("<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>");
        assert_eq!((r.content, r.tool_calls.len()), (None, 1));
        // Malformed JSON, or a call without arguments: all content.
        for bad in [
            "a <tool_call>{\"name\": \"f\", \"arguments\": </tool_call>",
            "<tool_call>{\"name\": \"f\"}</tool_call>",
            "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>",
        ] {
            let r = parse_tool_calls(bad);
            assert_eq!(r.content.as_deref(), Some(bad));
            assert!(r.tool_calls.is_empty());
        }
        assert_eq!(parse_tool_calls("plain").content.as_deref(), Some("plain"));
    }

    #[test]
    fn hermes_messages_write_what_qwens_template_writes() {
        let tools = [json!({"type": "function", "function": {"name": "add",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}})];
        let msgs = [
            json!({"role": "user", "content": "1+1?"}),
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1}}}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "2"}),
            json!({"role": "tool", "tool_call_id": "c2", "content": "3"}),
        ];
        let out = hermes_messages(&msgs, &tools);
        assert_eq!(out.len(), 4);
        let system = out[0]["content"].as_str().unwrap();
        assert!(system.starts_with("# Tools\n\n"), "{system}");
        assert!(
            system.contains("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"add\", \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}}}\n</tools>"),
            "{system}"
        );
        assert_eq!(
            out[2],
            json!({"role": "assistant", "content":
                "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>"})
        );
        assert_eq!(
            out[3],
            json!({"role": "user", "content":
                "<tool_response>\n2\n</tool_response>\n<tool_response>\n3\n</tool_response>"})
        );
        // A system message keeps its text, with the tools after it.
        let out = hermes_messages(&[json!({"role": "system", "content": "Be brief."})], &tools);
        assert!(out[0]["content"]
            .as_str()
            .unwrap()
            .starts_with("Be brief.\n\n# Tools"));
    }

    #[test]
    fn arguments_strings_become_values_for_templates() {
        let m = template_messages(&[json!({"role": "assistant", "tool_calls": [
            {"function": {"name": "f", "arguments": "{\"x\": 1}"}},
            {"function": {"name": "g", "arguments": "not json"}}]})]);
        assert_eq!(
            m[0]["tool_calls"][0]["function"]["arguments"],
            json!({"x": 1})
        );
        assert_eq!(
            m[0]["tool_calls"][1]["function"]["arguments"],
            json!("not json")
        );
    }
}
