//! Reply formats: how the policy writes its actions, and how we read them back.
//!
//! - [`ReplyFormat::ThinkAnswer`] (RAGEN): `<think>…</think><answer>a1 || a2</answer>`;
//! - [`ReplyFormat::React`] (AgentGym): `Thought: … Action: …`;
//! - [`ReplyFormat::Tools`] (agent frameworks, TRL's environments): one
//!   tool, `act`, called in the Hermes format Qwen2.5 is trained on,
//!   `<tool_call>{"name": "act", "arguments": {"action": "…"}}</tool_call>`
//!   per action, read back as vLLM's `hermes` parser reads it.

use agentrl_tokenizer::tools::{parse_tool_calls, python_json, TOOL_CALL_END, TOOL_CALL_START};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The one tool [`ReplyFormat::Tools`] offers: its name…
pub const ACT_TOOL: &str = "act";
/// …and its one argument, the action.
pub const ACT_ARGUMENT: &str = "action";

/// Why a reply could not be read as actions.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FormatError {
    #[error("no <answer>…</answer> block after <think>…</think>")]
    MissingAnswer,
    #[error("no 'Action:' line")]
    MissingAction,
    #[error("the answer holds no action")]
    EmptyAnswer,
    #[error("text after </answer>: the reply must end with its answer")]
    TrailingText,
    #[error("no well-formed <tool_call> with a JSON object of name and arguments")]
    MissingToolCall,
    #[error("a call to a tool other than 'act', or without a string 'action' argument")]
    WrongToolCall,
}

/// The reply format the policy is prompted (and trained) to use.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ReplyFormat {
    /// RAGEN's `<think>…</think><answer>a1 || a2</answer>`.
    #[default]
    ThinkAnswer,
    /// AgentGym's `Thought: …\nAction: …` (one action per turn).
    React,
    /// Tool calls: `<tool_call>{"name": "act", "arguments": {"action": …}}</tool_call>`,
    /// one per action, after optional free text (the thoughts).
    Tools,
}

impl ReplyFormat {
    /// The line appended to every observation telling the policy how to answer.
    pub fn instruction(self, max_actions: usize) -> String {
        match self {
            ReplyFormat::ThinkAnswer => format!(
                "Answer with <think>your thoughts</think><answer>action</answer>; up to {max_actions} actions separated by ' || '."
            ),
            ReplyFormat::React => {
                "Answer with 'Thought: your thoughts' then a line 'Action: your action'.".to_string()
            }
            ReplyFormat::Tools => format!(
                "Think, then act by calling the tool {name} once per action (up to {max_actions}), each call as {TOOL_CALL_START}\n{example}\n{TOOL_CALL_END}",
                name = ACT_TOOL,
                example = act_call("your action"),
            ),
        }
    }

    /// How a reply in this format opens: what RAGEN pre-fills the
    /// generation prompt with (`rollout.prefill`).
    pub fn prefill(self) -> &'static str {
        match self {
            ReplyFormat::ThinkAnswer => "<think>",
            ReplyFormat::React => "Thought:",
            // Thoughts come first and are free text: the only fixed opening
            // is the call, and pre-filling it would leave no room to think.
            ReplyFormat::Tools => "",
        }
    }

    /// Read the actions out of a reply. At most `max_actions` are returned
    /// (extra ones are dropped, as RAGEN does).
    pub fn parse(self, reply: &str, max_actions: usize) -> Result<Vec<String>, FormatError> {
        let actions: Vec<String> = match self {
            ReplyFormat::ThinkAnswer => {
                let (answer, rest) = think_answer_block(reply).ok_or(FormatError::MissingAnswer)?;
                // RL reinforces every token of a successful episode; if junk
                // after the answer were accepted it would be learnt and grow.
                if !rest.trim().is_empty() {
                    return Err(FormatError::TrailingText);
                }
                answer
                    .split("||")
                    .map(|a| a.trim().to_string())
                    .filter(|a| !a.is_empty())
                    .collect()
            }
            ReplyFormat::React => {
                let idx = reply.rfind("Action:").ok_or(FormatError::MissingAction)?;
                let rest = &reply[idx + "Action:".len()..];
                let line = rest.trim_start().lines().next().unwrap_or("").trim();
                if line.is_empty() {
                    vec![]
                } else {
                    vec![line.to_string()]
                }
            }
            ReplyFormat::Tools => tool_actions(reply)?,
        };
        if actions.is_empty() {
            return Err(FormatError::EmptyAnswer);
        }
        Ok(actions.into_iter().take(max_actions.max(1)).collect())
    }

    /// The reply's thoughts (what a plan or a reflection is read from):
    /// the text of its `<think>…</think>`, or of its `Thought:` before
    /// `Action:`; `None` when it has none or it is blank.
    pub fn thought(self, reply: &str) -> Option<String> {
        let text = match self {
            ReplyFormat::ThinkAnswer => {
                let start = reply.find("<think>")? + "<think>".len();
                let len = reply[start..].find("</think>")?;
                &reply[start..start + len]
            }
            ReplyFormat::React => {
                let start = reply.find("Thought:")? + "Thought:".len();
                let rest = &reply[start..];
                &rest[..rest.find("Action:").unwrap_or(rest.len())]
            }
            ReplyFormat::Tools => &reply[..reply.find(TOOL_CALL_START).unwrap_or(reply.len())],
        };
        let text = text.trim();
        (!text.is_empty()).then(|| text.to_string())
    }

    /// The thought part of a reply, as [`ReplyFormat::render`] begins it:
    /// `<think>…</think>` or `Thought: …` and its newline.
    pub fn render_thought(self, thought: &str) -> String {
        match self {
            ReplyFormat::ThinkAnswer => format!("<think>{thought}</think>"),
            ReplyFormat::React => format!("Thought: {thought}\n"),
            ReplyFormat::Tools => format!("{thought}\n"),
        }
    }

    /// Render actions as a well-formed reply (expert demonstrations).
    pub fn render(self, thought: &str, actions: &[String]) -> String {
        match self {
            ReplyFormat::ThinkAnswer => {
                format!(
                    "<think>{thought}</think><answer>{}</answer>",
                    actions.join(" || ")
                )
            }
            ReplyFormat::React => {
                let action = actions.first().map(String::as_str).unwrap_or("");
                format!("Thought: {thought}\nAction: {action}")
            }
            ReplyFormat::Tools => {
                let calls: Vec<String> = actions
                    .iter()
                    .map(|a| format!("{TOOL_CALL_START}\n{}\n{TOOL_CALL_END}", act_call(a)))
                    .collect();
                format!("{thought}\n{}", calls.join("\n"))
            }
        }
    }
}

/// `{"name": "act", "arguments": {"action": …}}` as Qwen2.5's template
/// writes a call (Python's `json.dumps` spacing).
fn act_call(action: &str) -> String {
    let args = serde_json::json!({ ACT_ARGUMENT: action });
    format!(
        "{{\"name\": \"{ACT_TOOL}\", \"arguments\": {}}}",
        python_json(&args)
    )
}

/// The actions of a [`ReplyFormat::Tools`] reply: each call's `action`
/// argument, read with vLLM's `hermes` parser rules (one malformed block
/// and no call counts). Arguments given as a JSON string holding the
/// object are read too, as models trained on OpenAI's wire form write them.
fn tool_actions(reply: &str) -> Result<Vec<String>, FormatError> {
    let parsed = parse_tool_calls(reply);
    if parsed.tool_calls.is_empty() {
        return Err(FormatError::MissingToolCall);
    }
    let mut actions = Vec::with_capacity(parsed.tool_calls.len());
    for call in &parsed.tool_calls {
        if call.name != ACT_TOOL {
            return Err(FormatError::WrongToolCall);
        }
        let mut args: serde_json::Value =
            serde_json::from_str(&call.arguments).map_err(|_| FormatError::WrongToolCall)?;
        if let Some(inner) = args
            .as_str()
            .and_then(|s| serde_json::from_str::<serde_json::Value>(s).ok())
        {
            args = inner;
        }
        let action = args
            .get(ACT_ARGUMENT)
            .and_then(serde_json::Value::as_str)
            .ok_or(FormatError::WrongToolCall)?;
        let action = action.trim();
        if !action.is_empty() {
            actions.push(action.to_string());
        }
    }
    Ok(actions)
}

/// The content of the first `<answer>…</answer>` that follows a closed
/// `<think>…</think>` (RAGEN's regex `<think>(.*?)</think>\s*<answer>(.*?)</answer>`),
/// and the text after it.
fn think_answer_block(reply: &str) -> Option<(&str, &str)> {
    let think_start = reply.find("<think>")?;
    let after_think = &reply[think_start + "<think>".len()..];
    let think_end = after_think.find("</think>")?;
    let rest = after_think[think_end + "</think>".len()..].trim_start();
    let rest = rest.strip_prefix("<answer>")?;
    let end = rest.find("</answer>")?;
    Some((&rest[..end], &rest[end + "</answer>".len()..]))
}

#[cfg(test)]
mod tests {

    #[test]
    fn thoughts_are_read_from_either_format() {
        let t = ReplyFormat::ThinkAnswer;
        assert_eq!(
            t.thought("<think> go right </think><answer>Right</answer>")
                .as_deref(),
            Some("go right")
        );
        assert_eq!(t.thought("<think></think><answer>Right</answer>"), None);
        assert_eq!(t.thought("<think>unclosed"), None);
        let r = ReplyFormat::React;
        assert_eq!(
            r.thought("Thought: look first\nAction: look").as_deref(),
            Some("look first")
        );
        assert_eq!(r.thought("Action: look"), None);
    }

    use super::*;

    #[test]
    fn tool_calls_are_read_as_actions_as_hermes_reads_them() {
        let f = ReplyFormat::Tools;
        let r = "go right twice\n<tool_call>\n{\"name\": \"act\", \"arguments\": {\"action\": \"R\"}}\n</tool_call>\n<tool_call>{\"name\": \"act\", \"arguments\": {\"action\": \" L \"}}</tool_call>";
        assert_eq!(f.parse(r, 5).unwrap(), vec!["R", "L"]);
        assert_eq!(f.parse(r, 1).unwrap(), vec!["R"]);
        assert_eq!(f.thought(r).as_deref(), Some("go right twice"));
        // Arguments as OpenAI's wire form (a string of JSON), and an
        // unclosed last call, are read too.
        let wire = r#"<tool_call>{"name": "act", "arguments": "{\"action\": \"R\"}"}"#;
        assert_eq!(f.parse(wire, 1).unwrap(), vec!["R"]);
        assert_eq!(f.parse("R", 1), Err(FormatError::MissingToolCall));
        // One malformed block and no call counts (the reply is all text).
        let broken = "<tool_call>{\"name\": \"act\", \"arguments\": {\"action\": \"R\"}}</tool_call><tool_call>oops</tool_call>";
        assert_eq!(f.parse(broken, 2), Err(FormatError::MissingToolCall));
        let other = r#"<tool_call>{"name": "search", "arguments": {"action": "R"}}</tool_call>"#;
        assert_eq!(f.parse(other, 1), Err(FormatError::WrongToolCall));
        let no_action = r#"<tool_call>{"name": "act", "arguments": {"move": "R"}}</tool_call>"#;
        assert_eq!(f.parse(no_action, 1), Err(FormatError::WrongToolCall));
        let blank = r#"<tool_call>{"name": "act", "arguments": {"action": " "}}</tool_call>"#;
        assert_eq!(f.parse(blank, 1), Err(FormatError::EmptyAnswer));
        // What render writes, parse reads back.
        let actions = vec!["R".to_string(), "say \"hi\"".to_string()];
        let rendered = f.render("plan", &actions);
        assert!(rendered.starts_with("plan\n<tool_call>\n{\"name\": \"act\", \"arguments\": {\"action\": \"R\"}}\n</tool_call>"), "{rendered}");
        assert_eq!(f.parse(&rendered, 2).unwrap(), actions);
        assert!(f.instruction(2).contains("<tool_call>"));
    }

    #[test]
    fn think_answer_splits_actions_and_caps_count() {
        let f = ReplyFormat::ThinkAnswer;
        let r = "<think>push it</think> <answer>Up || Left||Down</answer>";
        assert_eq!(f.parse(r, 5).unwrap(), vec!["Up", "Left", "Down"]);
        assert_eq!(f.parse(r, 2).unwrap(), vec!["Up", "Left"]);
    }

    #[test]
    fn think_answer_requires_both_blocks() {
        let f = ReplyFormat::ThinkAnswer;
        assert_eq!(
            f.parse("<answer>Up</answer>", 5),
            Err(FormatError::MissingAnswer)
        );
        assert_eq!(
            f.parse("<think>x</think>Up", 5),
            Err(FormatError::MissingAnswer)
        );
        assert_eq!(
            f.parse("<think>x</think><answer> || </answer>", 5),
            Err(FormatError::EmptyAnswer)
        );
        assert_eq!(f.parse("", 5), Err(FormatError::MissingAnswer));
        assert_eq!(
            f.parse("<think></think><answer>Up</answer>actio</answer>", 5),
            Err(FormatError::TrailingText)
        );
        assert_eq!(
            f.parse("<think></think><answer>Up</answer>\n ", 5).unwrap(),
            vec!["Up"]
        );
    }

    #[test]
    fn react_reads_last_action_line() {
        let f = ReplyFormat::React;
        assert_eq!(
            f.parse("Thought: go\nAction: go to desk 1\n", 1).unwrap(),
            vec!["go to desk 1"]
        );
        assert_eq!(f.parse("Thought: hmm", 1), Err(FormatError::MissingAction));
        assert_eq!(f.parse("Action:   ", 1), Err(FormatError::EmptyAnswer));
    }

    #[test]
    fn a_rendered_reply_begins_with_its_rendered_thought() {
        for f in [ReplyFormat::ThinkAnswer, ReplyFormat::React] {
            let acts = vec!["Up".to_string()];
            let reply = f.render("Left O", &acts);
            assert!(reply.starts_with(&f.render_thought("Left O")), "{reply}");
            assert_eq!(f.thought(&reply).as_deref(), Some("Left O"));
        }
    }

    #[test]
    fn render_parses_back() {
        for f in [ReplyFormat::ThinkAnswer, ReplyFormat::React] {
            let acts = vec!["Up".to_string()];
            assert_eq!(f.parse(&f.render("t", &acts), 5).unwrap(), acts);
        }
    }
}
