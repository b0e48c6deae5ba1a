#!/usr/bin/env python3
"""The OpenAI API of `agentrl serve-policy` as its clients use it.

Not part of CI. Starts `agentrl serve-policy` on a model directory and
drives it with the official `openai` SDK (sync and async) and, when
installed, LangChain's `ChatOpenAI` and `OpenAI`: streaming (completions and
chat, `stream_options.include_usage`), top log-probs with `text_offset`,
`echo` with prompt log-probs, penalties and `logit_bias`, `best_of`,
`response_format`, tools, `GET /v1/models/{id}`, `stop_reason` at the end of
sequence, a client that leaves mid-stream. Prints one line per check and a
summary; exits 1 if a check failed.

    python3 -m venv /tmp/venv-openai && /tmp/venv-openai/bin/pip install openai langchain-openai
    cargo build -p agentrl
    /tmp/venv-openai/bin/python scripts/openai_clients_check.py \\
        --bin target/debug/agentrl --model crates/model/tests/data/qwen2-tiny

A check whose behaviour depends on what the model writes (a tool call read
back from the reply) is reported SKIP when the model did not write one (a
random fixture never does); the JSON modes are checked to be refused.
"""

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
import traceback

import httpx
import openai

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "policy"

RESULTS = []


def check(name):
    """Run `fn(client)` as a check named `name`: PASS, FAIL (with why) or SKIP."""

    def wrap(fn):
        def run(*args):
            try:
                out = fn(*args)
                status = "SKIP" if isinstance(out, str) and out.startswith("skip") else "PASS"
                RESULTS.append((name, status, out if status == "SKIP" else ""))
            except Exception as e:  # noqa: BLE001 - a check reports any failure
                RESULTS.append((name, "FAIL", f"{type(e).__name__}: {e}"))
                if os.environ.get("VERBOSE"):
                    traceback.print_exc()

        run.check_name = name
        return run

    return wrap


def start_server(binary, model):
    proc = subprocess.Popen(
        [binary, "serve-policy", "--model", model, "--port", "0", "--served-model-name", NAME],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 300
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"serve-policy exited: {proc.wait()}")
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            return proc, m.group(1)
    raise SystemExit("serve-policy did not start in 300 s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/debug/agentrl"))
    ap.add_argument("--model", default=os.path.join(ROOT, "crates/model/tests/data/qwen2-tiny"))
    ap.add_argument("--url", help="an already running server's base URL (no --bin/--model)")
    args = ap.parse_args()
    proc = None
    if args.url:
        base = args.url
    else:
        proc, base = start_server(args.bin, args.model)
    try:
        run_checks(base)
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=30)
    width = max(len(n) for n, _, _ in RESULTS)
    for name, status, why in RESULTS:
        print(f"{status:4}  {name:{width}}  {why}")
    passed = sum(s == "PASS" for _, s, _ in RESULTS)
    failed = sum(s == "FAIL" for _, s, _ in RESULTS)
    skipped = sum(s == "SKIP" for _, s, _ in RESULTS)
    print(f"\n{passed} passed, {failed} failed, {skipped} skipped of {len(RESULTS)} checks "
          f"(openai {openai.__version__}, model {args.model if not args.url else base})")
    sys.exit(1 if failed else 0)


def run_checks(base):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
    card = client.models.retrieve(NAME)
    SMALL["on"] = (card.model_extra.get("max_model_len") or SMALL_CONTEXT) < SMALL_CONTEXT
    vocab_token = token_of(client)
    for fn in [
        models_list,
        models_retrieve,
        models_retrieve_unknown,
        completion_plain,
        completion_top_logprobs,
        completion_echo,
        completion_stream,
        completion_stream_logprobs,
        completion_best_of,
        completion_neutral_params,
        chat_plain,
        chat_top_logprobs,
        chat_stream,
        chat_stream_n2,
        chat_stream_manager,
        chat_seed_repeats,
        chat_penalties,
        chat_response_format_text,
        chat_response_format_json_refused,
        chat_tools_served,
        chat_tools_history,
        chat_tool_call_parsed,
        chat_stop_reason_null_at_eos,
        disconnect_mid_stream,
        async_client,
    ]:
        fn(client)
    logit_bias(client, vocab_token)
    langchain_checks(base)


def token_of(client):
    """A token id the model can be forced to: the first generated one of a greedy reply."""
    r = client.completions.create(
        model=NAME, prompt="Hello", max_tokens=1, temperature=0,
        extra_body={"return_token_ids": True},
    )
    return r.choices[0].model_extra["token_ids"][0]


@check("GET /v1/models")
def models_list(c):
    ids = [m.id for m in c.models.list()]
    assert NAME in ids, ids


@check("GET /v1/models/{id}")
def models_retrieve(c):
    m = c.models.retrieve(NAME)
    assert m.id == NAME and m.object == "model", m


@check("GET /v1/models/{unknown} -> NotFoundError")
def models_retrieve_unknown(c):
    try:
        c.models.retrieve("gpt-4o")
    except openai.NotFoundError:
        return
    raise AssertionError("no 404")


@check("completions: plain")
def completion_plain(c):
    r = c.completions.create(model=NAME, prompt="Once upon a time", max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens >= 1


@check("completions: logprobs=5 with text_offset")
def completion_top_logprobs(c):
    r = c.completions.create(model=NAME, prompt="Once upon a time", max_tokens=6,
                             temperature=0, logprobs=5)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == len(lp.top_logprobs)
    assert all(len(t) >= 5 for t in lp.top_logprobs), lp.top_logprobs
    # Greedy: the token is its step's best.
    for tok, l, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert abs(max(top.values()) - l) < 1e-6, (tok, l, top)
    for i in range(1, len(lp.tokens)):
        assert lp.text_offset[i] == lp.text_offset[i - 1] + len(lp.tokens[i - 1])


@check("completions: echo with prompt logprobs (max_tokens=0)")
def completion_echo(c):
    prompt = "The quick brown fox"
    r = c.completions.create(model=NAME, prompt=prompt, max_tokens=0, echo=True, logprobs=1,
                             extra_body={"prompt_logprobs": 1})
    ch = r.choices[0]
    assert ch.text == prompt, ch.text
    assert ch.logprobs.token_logprobs[0] is None
    assert all(isinstance(x, float) for x in ch.logprobs.token_logprobs[1:])
    assert ch.model_extra["prompt_logprobs"][0] is None


@check("completions: stream with include_usage")
def completion_stream(c):
    whole = c.completions.create(model=NAME, prompt="Once upon a time", max_tokens=12,
                                 temperature=0)
    text, finish, usage = "", None, None
    for chunk in c.completions.create(model=NAME, prompt="Once upon a time", max_tokens=12,
                                      temperature=0, stream=True,
                                      stream_options={"include_usage": True}):
        if chunk.choices:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    assert text == whole.choices[0].text, (text, whole.choices[0].text)
    assert finish == whole.choices[0].finish_reason
    assert usage and usage.total_tokens == whole.usage.total_tokens, usage


@check("completions: stream with logprobs=2")
def completion_stream_logprobs(c):
    n = 0
    for chunk in c.completions.create(model=NAME, prompt="Once", max_tokens=5, temperature=0,
                                      stream=True, logprobs=2):
        if chunk.choices and chunk.choices[0].logprobs:
            n += len(chunk.choices[0].logprobs.tokens)
            assert chunk.choices[0].logprobs.text_offset is not None
    assert n >= 1


@check("completions: best_of=3, n=1")
def completion_best_of(c):
    r = c.completions.create(model=NAME, prompt="Once", max_tokens=4, best_of=3, n=1, seed=1)
    assert len(r.choices) == 1


@check("completions: neutral penalties/best_of/logit_bias (LangChain's defaults)")
def completion_neutral_params(c):
    a = c.completions.create(model=NAME, prompt="Once", max_tokens=6, temperature=0)
    b = c.completions.create(model=NAME, prompt="Once", max_tokens=6, temperature=0,
                             frequency_penalty=0, presence_penalty=0, best_of=1, logit_bias={},
                             top_p=1, n=1)
    assert a.choices[0].text == b.choices[0].text


@check("chat: plain")
def chat_plain(c):
    r = c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hi!"}],
                                  max_tokens=8)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"


@check("chat: logprobs with top_logprobs=5")
def chat_top_logprobs(c):
    r = c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hi!"}],
                                  max_tokens=4, temperature=0, logprobs=True, top_logprobs=5)
    content = r.choices[0].logprobs.content
    assert content and all(len(t.top_logprobs) == 5 for t in content)
    assert all(t.top_logprobs[0].logprob >= t.top_logprobs[-1].logprob for t in content)


@check("chat: stream with include_usage")
def chat_stream(c):
    msgs = [{"role": "user", "content": "Tell me a story."}]
    whole = c.chat.completions.create(model=NAME, messages=msgs, max_tokens=12, temperature=0)
    roles, text, finish, usage = [], "", None, None
    for chunk in c.chat.completions.create(model=NAME, messages=msgs, max_tokens=12,
                                           temperature=0, stream=True,
                                           stream_options={"include_usage": True}):
        if chunk.choices:
            d = chunk.choices[0].delta
            if d.role:
                roles.append(d.role)
            text += d.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    assert roles == ["assistant"], roles
    assert text == whole.choices[0].message.content, (text, whole.choices[0].message.content)
    assert finish == whole.choices[0].finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens


@check("chat: stream with n=2")
def chat_stream_n2(c):
    seen = set()
    for chunk in c.chat.completions.create(model=NAME, max_tokens=4, n=2, stream=True,
                                           messages=[{"role": "user", "content": "Hi"}]):
        for ch in chunk.choices:
            seen.add(ch.index)
    assert seen == {0, 1}, seen


@check("chat: SDK stream manager (chat.completions.stream)")
def chat_stream_manager(c):
    text = []
    with c.chat.completions.stream(model=NAME, max_tokens=6,
                                   messages=[{"role": "user", "content": "Hi"}]) as s:
        for event in s:
            if event.type == "content.delta":
                text.append(event.delta)
        try:
            final = s.get_final_completion()
        except openai.LengthFinishReasonError as e:
            # The SDK's parse step refuses a reply cut at max_tokens, whoever
            # serves it; the completion it accumulated comes with the error.
            final = e.completion
    assert final.choices[0].message.role == "assistant"
    assert (final.choices[0].message.content or "") == "".join(text), (final, text)


@check("chat: seed repeats")
def chat_seed_repeats(c):
    def one():
        return c.chat.completions.create(model=NAME, seed=42, max_tokens=10, temperature=1.0,
                                         messages=[{"role": "user", "content": "Hi"}]
                                         ).choices[0].message.content
    assert one() == one()


@check("chat: frequency/presence penalties change a greedy reply")
def chat_penalties(c):
    msgs = [{"role": "user", "content": "Repeat after me: la la la la la la la la"}]
    plain = c.chat.completions.create(model=NAME, messages=msgs, max_tokens=30, temperature=0)
    pen = c.chat.completions.create(model=NAME, messages=msgs, max_tokens=30, temperature=0,
                                    frequency_penalty=2.0, presence_penalty=2.0)
    a, b = plain.choices[0].message.content, pen.choices[0].message.content
    if a == b:
        return "skip: the greedy reply has no repeats for the penalties to change"
    return None


def logit_bias(c, token):
    @check("completions: logit_bias +100 forces a token")
    def run(c):
        r = c.completions.create(model=NAME, prompt="Once upon", max_tokens=5, temperature=0,
                                 logit_bias={str(token): 100}, extra_body={
                                     "return_token_ids": True, "ignore_eos": True})
        assert r.choices[0].model_extra["token_ids"] == [token] * 5, r.choices[0]

    run(c)


@check("chat: response_format text")
def chat_response_format_text(c):
    c.chat.completions.create(model=NAME, max_tokens=3, response_format={"type": "text"},
                              messages=[{"role": "user", "content": "Hi"}])


@check("chat: response_format json_object refused (BadRequestError says why)")
def chat_response_format_json_refused(c):
    try:
        c.chat.completions.create(model=NAME, max_tokens=3,
                                  response_format={"type": "json_object"},
                                  messages=[{"role": "user", "content": "Hi"}])
    except openai.BadRequestError as e:
        assert "constrain" in str(e), e
        return
    raise AssertionError("accepted")


TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}]

# A model with a short context (the 512-token qwen2-tiny fixture, whose
# small vocabulary spends about 314 tokens on the tools preamble alone) gets
# the same checks with a bare tool and a history of one call: the server's
# refusal of a prompt past the context is right, and not what is checked.
SMALL_CONTEXT = 1024
SMALL = {"on": False}


def tools():
    if SMALL["on"]:
        return [{"type": "function", "function": {"name": "get_weather"}}]
    return TOOLS


@check("chat: tools accepted and rendered")
def chat_tools_served(c):
    r = c.chat.completions.create(model=NAME, max_tokens=20, temperature=0, tools=tools(),
                                  messages=[{"role": "user", "content": "Weather in Paris?"}],
                                  extra_body={"return_token_ids": True})
    prompt_ids = r.model_extra["prompt_token_ids"]
    assert len(prompt_ids) > 30
    m = r.choices[0].message
    assert m.content is not None or m.tool_calls, m


FEW_SHOT = [
    {"role": "system", "content": "You are a helpful assistant. Call a tool when it helps."},
    {"role": "user", "content": "What is the weather in London?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function",
         "function": {"name": "get_weather", "arguments": json.dumps({"city": "London"})}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": "rainy, 12 C"},
    {"role": "assistant", "content": "It is rainy in London, 12 C."},
    {"role": "user", "content": "What is the weather in Paris?"},
]

SHORT_HISTORY = [
    {"role": "user", "content": "Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function",
         "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
]


def history():
    return SHORT_HISTORY if SMALL["on"] else FEW_SHOT


def ask():
    """The messages a call is asked with: the few-shot history, or with a
    short context one question."""
    return [{"role": "user", "content": "Paris?"}] if SMALL["on"] else FEW_SHOT


@check("chat: tool_calls and tool messages in the history")
def chat_tools_history(c):
    # A short context holds the tools or the history, not both.
    with_tools = {} if SMALL["on"] else {"tools": TOOLS}
    r = c.chat.completions.create(model=NAME, max_tokens=30, temperature=0, messages=history(),
                                  extra_body={"return_token_ids": True}, **with_tools)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    prompt = c.completions.create(model=NAME, prompt=r.model_extra["prompt_token_ids"],
                                  max_tokens=0, echo=True).choices[0].text
    assert "<tool_call>" in prompt and "<tool_response>" in prompt, prompt


@check("chat: a <tool_call> reply comes back as tool_calls (stream and not)")
def chat_tool_call_parsed(c):
    r = c.chat.completions.create(model=NAME, max_tokens=40, temperature=0, tools=tools(),
                                  messages=ask())
    ch = r.choices[0]
    if not ch.message.tool_calls:
        return f"skip: the model did not call a tool ({ch.message.content!r:.60})"
    call = ch.message.tool_calls[0]
    assert ch.finish_reason == "tool_calls", ch.finish_reason
    assert call.function.name == "get_weather", call
    json.loads(call.function.arguments)
    calls, content = {}, ""
    for chunk in c.chat.completions.create(model=NAME, max_tokens=40, temperature=0,
                                           tools=tools(), messages=ask(), stream=True):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                calls[tc.index] = tc
    assert calls and calls[0].function.name == "get_weather", (calls, content)
    return None


@check("chat: stop_reason null at the end of sequence (vLLM)")
def chat_stop_reason_null_at_eos(c):
    # Force the end-of-turn token: the model's own end of sequence.
    tok = c.completions.create(model=NAME, prompt="<|im_end|>", max_tokens=1,
                               extra_body={"return_token_ids": True})
    im_end = tok.choices[0].model_extra["prompt_token_ids"][-1]
    r = c.chat.completions.create(model=NAME, max_tokens=5, temperature=0,
                                  logit_bias={str(im_end): 100},
                                  messages=[{"role": "user", "content": "Hi"}])
    ch = r.choices[0]
    assert ch.finish_reason == "stop", ch
    assert ch.model_extra.get("stop_reason", "missing") is None, ch.model_extra


@check("a client that leaves mid-stream; the server goes on")
def disconnect_mid_stream(c):
    s = c.completions.create(model=NAME, prompt="Once", max_tokens=400, stream=True,
                             extra_body={"ignore_eos": True})
    next(iter(s))
    s.close()
    r = c.completions.create(model=NAME, prompt="Once", max_tokens=3)
    assert r.choices


@check("AsyncOpenAI: chat and a stream")
def async_client(c):
    async def go():
        a = openai.AsyncOpenAI(base_url=str(c.base_url), api_key="unused")
        r = await a.chat.completions.create(model=NAME, max_tokens=4,
                                            messages=[{"role": "user", "content": "Hi"}])
        n = 0
        async for _ in await a.chat.completions.create(
                model=NAME, max_tokens=4, stream=True,
                messages=[{"role": "user", "content": "Hi"}]):
            n += 1
        await a.close()
        return r, n

    r, n = asyncio.run(go())
    assert r.choices and n >= 2


def langchain_checks(base):
    try:
        from langchain_openai import ChatOpenAI, OpenAI
    except ImportError:
        RESULTS.append(("LangChain", "SKIP", "langchain-openai is not installed"))
        return
    chat = ChatOpenAI(base_url=f"{base}/v1", api_key="unused", model=NAME, max_tokens=12,
                      temperature=0)

    @check("LangChain ChatOpenAI: invoke")
    def lc_invoke(_):
        assert isinstance(chat.invoke("Hi!").content, str)

    @check("LangChain ChatOpenAI: stream (stream_usage)")
    def lc_stream(_):
        parts = list(ChatOpenAI(base_url=f"{base}/v1", api_key="unused", model=NAME,
                                max_tokens=12, temperature=0, stream_usage=True).stream("Hi!"))
        text = "".join(p.content for p in parts)
        assert text == chat.invoke("Hi!").content, text
        assert any(p.usage_metadata for p in parts)

    @check("LangChain ChatOpenAI: bind_tools invoke")
    def lc_tools(_):
        from langchain_core.tools import tool

        @tool
        def get_weather(city: str) -> str:
            """Get the current weather in a city."""
            return "sunny"

        @tool
        def w(c: str) -> str:
            """W."""
            return "sunny"

        bound = chat.bind_tools([w] if SMALL["on"] else [get_weather])
        msg = bound.invoke("Paris?" if SMALL["on"] else "What is the weather in Paris?")
        assert isinstance(msg.content, str) or msg.tool_calls

    @check("LangChain ChatOpenAI: logprobs")
    def lc_logprobs(_):
        msg = ChatOpenAI(base_url=f"{base}/v1", api_key="unused", model=NAME, max_tokens=4,
                         logprobs=True, top_logprobs=3).invoke("Hi")
        assert msg.response_metadata["logprobs"]["content"][0]["top_logprobs"]

    @check("LangChain OpenAI (completions LLM): invoke and stream")
    def lc_llm(_):
        llm = OpenAI(base_url=f"{base}/v1", api_key="unused", model=NAME, max_tokens=8,
                     temperature=0)
        a = llm.invoke("Once upon a time")
        b = "".join(llm.stream("Once upon a time"))
        assert a == b, (a, b)

    for fn in [lc_invoke, lc_stream, lc_tools, lc_logprobs, lc_llm]:
        fn(None)


if __name__ == "__main__":
    main()
