//! Tokenizer and chat template: the qwen2-tiny fixture made by transformers,
//! and byte-level BPE training.

use agentrl_tokenizer::{
    ChatMessage, ChatTokenizer, TemplateError, TokenizerError, CHATML_TEMPLATE,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

#[path = "../../model/tests/model/qwen2_tiny/mod.rs"]
mod qwen2_tiny;
use qwen2_tiny::{fixture_dir, reference, u32s as ids};

fn reference_messages(r: &Value) -> Vec<ChatMessage> {
    serde_json::from_value(r["chat_messages"].clone()).unwrap()
}

/// `messages` rendered by the fixture's tokenizer with `template` as its
/// chat template, without the generation prompt.
fn render_with(template: &str, messages: &[ChatMessage]) -> Result<String, TokenizerError> {
    let mut tok = ChatTokenizer::load(fixture_dir()).unwrap();
    tok.set_chat_template(template).unwrap();
    tok.render_chat(messages, false)
}

/// The tokenizer saved in `dir` renders one user message "x" (with the
/// generation prompt when `prompt`).
fn render_user_x(dir: &std::path::Path, prompt: bool) -> String {
    let tok = ChatTokenizer::load(dir).unwrap();
    tok.render_chat(&[ChatMessage::user("x")], prompt).unwrap()
}

/// Environment-like text: Sokoban boards (with `√` for a box on target),
/// instructions and replies, drawn from a fixed seed.
fn env_corpus(seed: u64, n: usize) -> Vec<String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let cells = ['_', '_', '_', '#', 'O', 'X', '√'];
    let moves = ["Up", "Down", "Left", "Right"];
    (0..n)
        .map(|i| {
            let mut board = String::from("#######\n");
            for row in 0..3 {
                board.push('#');
                for col in 0..5 {
                    let c = if row == 1 && col == 2 {
                        'P'
                    } else {
                        cells[rng.random_range(0..cells.len())]
                    };
                    board.push(c);
                }
                board.push_str("#\n");
            }
            board.push_str("#######");
            let m = moves[rng.random_range(0..moves.len())];
            format!(
                "<|im_start|>user\nTurn {i}. You are a Sokoban player. Push every box onto a target.\n{board}\nYour move?<|im_end|>\n<|im_start|>assistant\n<think>The box is near the target, so I move {m}.</think><answer>{m}</answer><|im_end|>\n"
            )
        })
        .collect()
}

#[test]
fn fixture_template_renders_the_reference_chat_text() {
    let r = reference();
    let tok = ChatTokenizer::load(fixture_dir()).unwrap();
    let text = tok.render_chat(&reference_messages(&r), true).unwrap();
    assert_eq!(text, r["chat_text"].as_str().unwrap());
}

#[test]
fn fixture_encoding_matches_reference_ids() {
    let r = reference();
    let tok = ChatTokenizer::load(fixture_dir()).unwrap();
    let got = tok.encode(r["chat_text"].as_str().unwrap()).unwrap();
    assert_eq!(got, ids(&r["input_ids"]));
    assert_eq!(
        tok.encode_chat(&reference_messages(&r), true).unwrap(),
        ids(&r["input_ids"])
    );
}

#[test]
fn fixture_decode_round_trips_and_skips_special_tokens() {
    let r = reference();
    let tok = ChatTokenizer::load(fixture_dir()).unwrap();
    let input = ids(&r["input_ids"]);
    assert_eq!(
        tok.decode(&input, false).unwrap(),
        r["chat_text"].as_str().unwrap()
    );
    let plain = tok.decode(&input, true).unwrap();
    assert!(!plain.contains("<|im_start|>") && !plain.contains("<|im_end|>"));
    assert!(plain.starts_with("system\nYou are a Sokoban player."));
}

#[test]
fn fixture_special_token_ids_follow_tokenizer_json() {
    let tok = ChatTokenizer::load(fixture_dir()).unwrap();
    assert_eq!(tok.endoftext_id(), Some(0));
    assert_eq!(tok.im_start_id(), 1);
    assert_eq!(tok.im_end_id(), 2);
    // tokenizer_config.json: eos_token <|im_end|>, pad_token <|endoftext|>.
    assert_eq!(tok.eos_id(), 2);
    assert_eq!(tok.pad_id(), 0);
    assert_eq!(tok.stop_ids(), vec![2, 0]);
    assert_eq!(tok.vocab_size(), 384);
    assert_eq!(tok.token_id("<|im_end|>"), Some(2));
    assert_eq!(tok.token_id("no such token"), None);
}

#[test]
fn load_of_missing_directory_names_the_file() {
    let err = ChatTokenizer::load("/nonexistent/agentrl-tok").unwrap_err();
    assert!(matches!(err, TokenizerError::Io { .. }));
    assert!(err
        .to_string()
        .contains("/nonexistent/agentrl-tok/tokenizer.json"));
}

#[test]
fn load_of_corrupt_tokenizer_json_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), "{not json").unwrap();
    let err = ChatTokenizer::load(dir.path()).unwrap_err();
    assert!(matches!(err, TokenizerError::Parse { .. }), "{err}");
    assert!(err.to_string().contains("tokenizer.json"));
}

#[test]
fn fixture_save_then_load_keeps_encodings_and_template() {
    let r = reference();
    let tok = ChatTokenizer::load(fixture_dir()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    tok.save(dir.path()).unwrap();
    let back = ChatTokenizer::load(dir.path()).unwrap();
    let text = r["chat_text"].as_str().unwrap();
    assert_eq!(back.encode(text).unwrap(), ids(&r["input_ids"]));
    assert_eq!(back.chat_template(), tok.chat_template());
    assert_eq!(back.eos_id(), tok.eos_id());
    // What transformers' AutoTokenizer reads (checked by hand with
    // transformers 4.57 and 5.18: same ids, same rendered chat).
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("tokenizer_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(config["tokenizer_class"], "PreTrainedTokenizerFast");
    assert_eq!(config["eos_token"], "<|im_end|>");
    assert_eq!(config["added_tokens_decoder"]["2"]["content"], "<|im_end|>");
    let map: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("special_tokens_map.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(map["pad_token"], "<|endoftext|>");
}

fn generation_config(dir: &std::path::Path) -> Value {
    let text = std::fs::read_to_string(dir.join("generation_config.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// transformers' `generate` stops at `eos_token_id` of generation_config.json
/// (a list, as Qwen2.5 writes it); without `<|im_end|>` there it runs past
/// the end of the turn.
#[test]
fn saved_tokenizers_name_im_end_as_the_end_of_generation() {
    let dir = tempfile::tempdir().unwrap();
    let trained = ChatTokenizer::train_bpe(&env_corpus(6, 30), 300).unwrap();
    trained.save(dir.path()).unwrap();
    // <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2.
    assert_eq!(
        generation_config(dir.path()),
        serde_json::json!({"bos_token_id": 0, "eos_token_id": [2, 0], "pad_token_id": 0})
    );

    // A model directory's own file keeps its other keys and stop tokens;
    // ours come first, and it no longer claims to mirror config.json.
    let source = tempfile::tempdir().unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixture_dir().join(f), source.path().join(f)).unwrap();
    }
    std::fs::write(
        source.path().join("generation_config.json"),
        r#"{"_from_model_config": true, "eos_token_id": 5, "temperature": 0.7, "top_p": 0.8, "transformers_version": "4.37.0"}"#,
    )
    .unwrap();
    // The tokenizer of `dir`, loaded and saved to a new directory.
    let resave = |dir: &std::path::Path| {
        let out = tempfile::tempdir().unwrap();
        ChatTokenizer::load(dir).unwrap().save(out.path()).unwrap();
        out
    };
    let out = resave(source.path());
    assert_eq!(
        generation_config(out.path()),
        serde_json::json!({
            "bos_token_id": 0,
            "eos_token_id": [2, 0, 5],
            "pad_token_id": 0,
            "temperature": 0.7,
            "top_p": 0.8,
            "transformers_version": "4.37.0"
        })
    );
    // Saved again from what was saved: the same file.
    let again = resave(out.path());
    assert_eq!(
        generation_config(again.path()),
        generation_config(out.path())
    );
}

#[test]
fn bpe_training_is_deterministic_and_independent_of_input_order() {
    let texts = env_corpus(7, 120);
    let a = ChatTokenizer::train_bpe(&texts, 400).unwrap();
    let b = ChatTokenizer::train_bpe(&texts, 400).unwrap();
    let mut reversed = texts.clone();
    reversed.reverse();
    let c = ChatTokenizer::train_bpe(&reversed, 400).unwrap();
    let json = |t: &ChatTokenizer| t.inner().to_string(false).unwrap();
    assert_eq!(json(&a), json(&b));
    assert_eq!(json(&a), json(&c));
}

#[test]
fn bpe_round_trips_text_it_never_saw() {
    let tok = ChatTokenizer::train_bpe(&env_corpus(1, 80), 350).unwrap();
    for text in [
        "#######\n#_P_√_#\n#_X_O_#\n#######",
        "naïve café — 東京 🚀 ünïcödé",
        "tabs\tand\r\nwindows lines, \u{0} nul and \u{7f} del",
        "   leading and trailing spaces   ",
        "",
    ] {
        let ids = tok.encode(text).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text, "{text:?}");
    }
}

#[test]
fn bpe_special_tokens_are_single_ids() {
    let tok = ChatTokenizer::train_bpe(&env_corpus(2, 60), 320).unwrap();
    assert_eq!(tok.endoftext_id(), Some(0));
    assert_eq!(tok.im_start_id(), 1);
    assert_eq!(tok.im_end_id(), 2);
    assert_eq!(tok.eos_id(), 2);
    let ids = tok
        .encode("<|im_start|>user\nhi<|im_end|><|endoftext|>")
        .unwrap();
    assert_eq!(ids[0], 1);
    assert_eq!(&ids[ids.len() - 2..], &[2, 0]);
    // The special strings never became pieces of learnt merges.
    for id in 3..tok.vocab_size() as u32 {
        let piece = tok.token(id).unwrap();
        assert!(!piece.contains("<|im"), "{piece}");
    }
}

#[test]
fn bpe_vocab_size_is_respected() {
    let texts = env_corpus(3, 120);
    for size in [270, 320] {
        let tok = ChatTokenizer::train_bpe(&texts, size).unwrap();
        assert_eq!(tok.vocab_size(), size);
    }
    // Merges stay inside words and tags: this corpus has fewer than 500.
    let capped = ChatTokenizer::train_bpe(&texts, 500).unwrap();
    assert!(capped.vocab_size() < 500);
    // Tiny text: fewer merges exist than asked for, never more tokens.
    let small = ChatTokenizer::train_bpe(&["ab ab".to_string()], 1000).unwrap();
    assert!(small.vocab_size() < 300);
    let err = ChatTokenizer::train_bpe(&texts, 200).unwrap_err();
    assert!(matches!(err, TokenizerError::Train(_)));
    // An absurd target is an error, not an abort on the trainer's up-front
    // reservation (10^12 tokens).
    let err = ChatTokenizer::train_bpe(&texts, 1_000_000_000_000).unwrap_err();
    assert!(err.to_string().contains("1000000000000"), "{err}");
    assert!(ChatTokenizer::train_bpe(&texts, agentrl_tokenizer::MAX_TRAINED_VOCAB).is_ok());
}

#[test]
fn bpe_save_then_load_gives_identical_encodings() {
    let texts = env_corpus(4, 100);
    let tok = ChatTokenizer::train_bpe(&texts, 450).unwrap();
    let dir = tempfile::tempdir().unwrap();
    tok.save(dir.path()).unwrap();
    let back = ChatTokenizer::load(dir.path()).unwrap();
    for text in texts.iter().take(10).chain([&"√√ 東京".to_string()]) {
        assert_eq!(back.encode(text).unwrap(), tok.encode(text).unwrap());
    }
    assert_eq!(back.vocab_size(), tok.vocab_size());
    assert_eq!(back.chat_template(), Some(CHATML_TEMPLATE));
    // Saving twice gives the same bytes.
    let dir2 = tempfile::tempdir().unwrap();
    back.save(dir2.path()).unwrap();
    for file in [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ] {
        let a = std::fs::read(dir.path().join(file)).unwrap();
        let b = std::fs::read(dir2.path().join(file)).unwrap();
        assert_eq!(a, b, "{file}");
    }
}

#[test]
fn bpe_tokenizer_renders_chatml() {
    let tok = ChatTokenizer::train_bpe(&env_corpus(5, 40), 300).unwrap();
    let msgs = [ChatMessage::system("S"), ChatMessage::user("U")];
    assert_eq!(
        tok.render_chat(&msgs, true).unwrap(),
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        tok.render_chat(&msgs, false).unwrap(),
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
    );
}

#[test]
fn broken_template_is_a_syntax_error_naming_the_problem() {
    let mut tok = ChatTokenizer::load(fixture_dir()).unwrap();
    let err = tok
        .set_chat_template("{% for message in messages %}{{ message['content'] }}")
        .unwrap_err();
    match err {
        TokenizerError::Template(TemplateError::Syntax(msg)) => {
            assert!(
                msg.contains("endfor") || msg.contains("end of input"),
                "{msg}"
            )
        }
        other => panic!("expected a syntax error, got {other}"),
    }
}

#[test]
fn raise_exception_surfaces_its_message() {
    let template = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('System message first!') }}{% endif %}ok";
    let err = render_with(template, &[ChatMessage::user("hi")]).unwrap_err();
    assert!(err.to_string().contains("System message first!"), "{err}");
    let ok = render_with(template, &[ChatMessage::system("s")]).unwrap();
    assert_eq!(ok, "ok");
}

#[test]
fn python_string_methods_and_hf_whitespace_rules_work() {
    // trim_blocks + lstrip_blocks as in transformers; .strip()/.startswith()
    // from pycompat; eos_token from tokenizer_config.json.
    let template = "{% for m in messages %}\n    {% if m.content.startswith('!') %}\n[{{ m.content.strip('! ') }}]\n    {% else %}\n{{ m.content.strip() | upper }}{{ eos_token }}\n    {% endif %}\n{% endfor %}\n";
    let messages = [ChatMessage::user("  hi  "), ChatMessage::user("! bang !")];
    let out = render_with(template, &messages).unwrap();
    assert_eq!(out, "HI<|im_end|>\n[bang]\n");
}

#[test]
fn tojson_matches_python_json_dumps() {
    let template = "{{ messages[0] | tojson }}|{{ ['é<&>', 1, 2.5, none, true] | tojson }}|{{ {'a': [1, {'b': []}]} | tojson(indent=2) }}";
    let out = render_with(template, &[ChatMessage::user("say \"hi\"\n")]).unwrap();
    assert_eq!(
        out,
        "{\"role\": \"user\", \"content\": \"say \\\"hi\\\"\\n\"}|[\"é<&>\", 1, 2.5, null, true]|{\n  \"a\": [\n    1,\n    {\n      \"b\": []\n    }\n  ]\n}"
    );
}

/// A Qwen2.5-style template: whitespace control, `namespace`, `loop.first`,
/// `is string`, `.endswith()`, `.split()`, filters. The expected strings are
/// what Jinja2 3.1 renders in transformers' environment (trim_blocks,
/// lstrip_blocks, loopcontrols).
const QWEN_LIKE_TEMPLATE: &str = r#"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(turns=0) %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {%- set ns.turns = ns.turns + 1 %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content is string and message.content.endswith('</answer>') %}
            {{- '\n' + message.content.split('</think>')[-1] | trim }}
        {%- else %}
            {{- '\n' + message.content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
{{- '' if ns.turns > 1 else '' }}
"#;

#[test]
fn qwen_style_template_renders_as_jinja2_does() {
    let mut tok = ChatTokenizer::load(fixture_dir()).unwrap();
    tok.set_chat_template(QWEN_LIKE_TEMPLATE).unwrap();
    let msgs = vec![
        ChatMessage::user("Push the box.\n#__√#"),
        ChatMessage::assistant("<think>hmm</think> <answer>Up</answer>"),
        ChatMessage::user("Again"),
    ];
    assert_eq!(
        tok.render_chat(&msgs, true).unwrap(),
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nPush the box.\n#__√#<|im_end|>\n<|im_start|>assistant\n<answer>Up</answer><|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n"
    );
    let mut with_system = vec![ChatMessage::system("S")];
    with_system.extend(msgs);
    assert_eq!(
        tok.render_chat(&with_system, false).unwrap(),
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nPush the box.\n#__√#<|im_end|>\n<|im_start|>assistant\n<answer>Up</answer><|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n"
    );
}

/// A directory with the fixture's tokenizer.json and the given config.
fn dir_with_config(config: &Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture_dir().join("tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    dir
}

#[test]
fn chat_template_jinja_file_is_used_when_config_has_none() {
    let dir = dir_with_config(&serde_json::json!({"eos_token": "<|im_end|>"}));
    let no_template = ChatTokenizer::load(dir.path()).unwrap();
    let err = no_template
        .render_chat(&[ChatMessage::user("x")], true)
        .unwrap_err();
    assert!(matches!(err, TokenizerError::NoChatTemplate));
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}",
    )
    .unwrap();
    assert_eq!(render_user_x(dir.path(), true), "[user]x");
}

#[test]
fn named_template_list_picks_default() {
    let dir = dir_with_config(&serde_json::json!({
        "chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "default:{{ messages | length }}"}
        ]
    }));
    assert_eq!(render_user_x(dir.path(), false), "default:1");
}

#[test]
fn added_tokens_declared_only_in_config_are_added_with_their_ids() {
    let dir = dir_with_config(&serde_json::json!({
        "added_tokens_decoder": {
            "384": {"content": "<think>", "special": false, "normalized": false}
        }
    }));
    let tok = ChatTokenizer::load(dir.path()).unwrap();
    assert_eq!(tok.token_id("<think>"), Some(384));
    let ids = tok.encode("<think>hi").unwrap();
    assert_eq!(ids[0], 384);
    assert_eq!(tok.decode(&ids, true).unwrap(), "<think>hi");

    let wrong = dir_with_config(&serde_json::json!({
        "added_tokens_decoder": {"999": {"content": "<think>", "special": true}}
    }));
    let err = ChatTokenizer::load(wrong.path()).unwrap_err();
    assert!(err.to_string().contains("tokenizer_config.json"), "{err}");
}

#[test]
fn eos_token_missing_from_vocabulary_is_an_error_naming_it() {
    let dir = dir_with_config(&serde_json::json!({"eos_token": "</s>"}));
    let err = ChatTokenizer::load(dir.path()).unwrap_err();
    assert!(err.to_string().contains("</s>"), "{err}");
}

#[test]
fn chat_tokenizer_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ChatTokenizer>();
}

#[test]
fn bpe_keeps_grid_cells_single_tokens_and_merges_tags_and_words() {
    // Grids repeat runs like `____` and `####` thousands of times: GPT-2's
    // pre-tokenizer would let BPE merge them, so a cell's token position
    // would depend on its row's contents.
    let mut texts = env_corpus(5, 120);
    texts.extend((0..200).map(|_| "######\n#____#\n#_PX_#\n#____#\n######".to_string()));
    texts.extend((0..200).map(|_| "<think></think><answer>Down</answer>".to_string()));
    let tok = ChatTokenizer::train_bpe(&texts, 400).unwrap();
    let pieces = |text: &str| -> Vec<String> {
        let ids = tok.encode(text).unwrap();
        ids.iter()
            .map(|&id| tok.decode(&[id], false).unwrap())
            .collect()
    };
    assert_eq!(pieces("#____#"), ["#", "_", "_", "_", "_", "#"]);
    assert_eq!(pieces("OO_G"), ["O", "O", "_", "G"]);
    assert_eq!(pieces("P__√"), ["P", "_", "_", "√"]);
    assert_eq!(pieces("100"), ["1", "0", "0"]);
    assert_eq!(
        pieces("<think></think><answer>Down</answer>"),
        ["<think>", "</think>", "<answer>", "Down", "</answer>"]
    );
}
