#!/usr/bin/env python3
"""Record AgentGym's own env clients talking to an env server, as JSON transcripts.

The clients are AgentGym's (``agentenv.envs.*EnvClient`` and ``*Task``, the
code AgentGym's evaluation loop and AgentGym-RL's rollout call); nothing here
re-implements their protocol. Every HTTP exchange they make is recorded by
wrapping ``requests.post`` / ``requests.get`` (the only calls the clients
use), in order, with the client-side outcome (what the client returned or the
exception it raised) between the exchanges.

Two targets:

``--target agentgym``
    AgentGym's own FastAPI env servers, started from an AgentGym checkout on
    127.0.0.1, a fresh server process for each env (ids then start at 0, so the
    transcript is the same on every run). Output: the committed test data,
    ``crates/server/tests/data/agentgym/<env>.json``.
``--target agentrl``
    ``agentrl serve`` started on 127.0.0.1, each client pointed at
    ``http://127.0.0.1:PORT/<env>``. Output: wherever ``--out`` says; these
    transcripts show what fails today and are not test data.

For each env the script runs one scenario, every step labelled with a
``phase``:

1. ``client.*``: create -> reset -> observe -> a valid step -> an invalid
   action -> steps until done -> a step after done -> close -> a second close;
2. ``task.*``: AgentGym's ``BaseTask.generate_experience`` loop with a
   scripted agent (an ``APIAgent`` whose ``generate`` reads the conversation
   and answers ``Thought: …\\n\\nAction:\\n<action>``), then closing its client;
3. ``probe.*``: raw requests the clients never send but a trainer or a
   server replacement must get right (no body, a missing field, an unknown
   id, an out-of-range ``data_idx``, ``GET /observation``).

Every process this script starts is stopped before it exits.
See README.md beside this file for the venv and the exact commands.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "crates" / "server" / "tests" / "data" / "agentgym"
ALL_ENVS = ["textcraft", "babyai", "sciworld", "alfworld", "webshop", "searchqa"]
TIMEOUT_S = 60
# `Scenario.raw`'s body when the request has none at all (not even `null`).
NO_BODY = object()


# --------------------------------------------------------------------- recorder


class Recorder:
    """Wraps ``requests.post``/``requests.get`` and keeps every exchange."""

    def __init__(self, requests_module: Any, base: str) -> None:
        self.requests = requests_module
        self.base = base.rstrip("/")
        self.entries: list[dict[str, Any]] = []
        self.phase = "setup"
        self._post = requests_module.post
        self._get = requests_module.get

    def install(self) -> None:
        self.requests.post = self._wrap("POST", self._post)
        self.requests.get = self._wrap("GET", self._get)

    def uninstall(self) -> None:
        self.requests.post = self._post
        self.requests.get = self._get

    def last_session_id(self) -> Any:
        """The id the last successful ``/create`` answered (``{"id"}`` or bare)."""
        for e in reversed(self.entries):
            if e.get("path") == "/create" and e.get("status") == 200:
                body = e.get("response")
                return body.get("id") if isinstance(body, dict) else body
        return None

    def set_phase(self, phase: str) -> None:
        self.phase = phase

    def note(self, **fields: Any) -> None:
        """A client-side event (a return value, an exception) in the log."""
        self.entries.append({"phase": self.phase, **fields})

    def _path(self, url: str) -> str:
        if url.startswith(self.base):
            return url[len(self.base) :] or "/"
        return url

    def _wrap(self, method: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(url: str, *args: Any, **kwargs: Any) -> Any:
            entry: dict[str, Any] = {
                "phase": self.phase,
                "method": method,
                "path": self._path(url),
            }
            if method == "POST":
                # None = no body at all (the clients' bare `requests.post(url)`).
                entry["request"] = kwargs.get("json", kwargs.get("data"))
            resp = real(url, *args, **kwargs)
            entry["status"] = resp.status_code
            try:
                entry["response"] = resp.json()
            except ValueError:
                entry["response_text"] = resp.text
            self.entries.append(entry)
            return resp

        return call


# --------------------------------------------------------------------- policies


def react(action: str) -> str:
    """An LLM reply in AgentGym's ReAct format, which every client here parses."""
    return f"Thought:\nI follow my plan.\n\nAction:\n{action}"


class TextCraftPolicy:
    """Plans from the crafting commands and the goal: craft what a command
    makes, `get` everything else, innermost ingredients first."""

    def __init__(self) -> None:
        self.plan: list[str] = []

    def start(self, observation: str) -> None:
        recipes: dict[str, list[tuple[int, list[tuple[int, str]]]]] = {}
        for line in observation.splitlines():
            m = re.match(r"craft (\d+) (.+?) using (.+)$", line.strip())
            if not m:
                continue
            ins = []
            for part in m.group(3).split(","):
                c, item = part.strip().split(" ", 1)
                ins.append((int(c), item))
            recipes.setdefault(m.group(2), []).append((int(m.group(1)), ins))
        goal = re.search(r"Goal: craft (.+?)\.", observation)
        self.plan = []
        if goal:
            self._obtain(goal.group(1), 1, recipes, set())

    def _obtain(self, item: str, count: int, recipes: dict, path: set) -> None:
        options = [
            r
            for r in recipes.get(item, [])
            if not any(ing in path or ing == item for _, ing in r[1])
        ]
        if not options:
            self.plan.append(f"get {count} {item}")
            return
        # Prefer a recipe made only of items no command makes (fewest crafts).
        options.sort(key=lambda r: sum(ing in recipes for _, ing in r[1]))
        out, ins = options[0]
        for _ in range(math.ceil(count / out)):
            for c, ing in ins:
                self._obtain(ing, c, recipes, path | {item})
            self.plan.append(
                f"craft {out} {item} using " + ", ".join(f"{c} {i}" for c, i in ins)
            )

    def act(self, observation: str) -> str:
        return self.plan.pop(0) if self.plan else "inventory"


class BabyAIPolicy:
    """Goes to (or picks up) the goal object when the server lists that
    action, else turns right to look around."""

    def __init__(self) -> None:
        self.target = ""
        self.verb = "go to"

    def start(self, observation: str) -> None:
        m = re.search(r"Your goal: (go to|pick up) (?:the |a )?(.+?)$", observation, re.M)
        if m:
            self.verb, self.target = m.group(1), m.group(2)

    def act(self, observation: str) -> str:
        m = re.search(r"Available actions: (\[.*\])", observation)
        available = json.loads(m.group(1)) if m else []
        verb = "pickup" if self.verb == "pick up" else "go to"
        wanted = f"{verb} {self.target} 1"
        return wanted if wanted in available else "turn right"


class SciWorldPolicy:
    """Solves 'find a(n) … thing' tasks: focus on the first object in the
    room, pick it up, walk to the named room and put it in the named box."""

    def __init__(self) -> None:
        self.plan: list[str] = []

    def start(self, observation: str) -> None:
        self.plan = []
        goal = re.search(r"move it to the (.+?) in the (.+?)\.", observation)
        thing = None
        for line in observation.splitlines():
            m = re.match(r"\s*an? (?!substance)(.+)$", line)
            if m:
                thing = m.group(1).strip()
                break
        if goal and thing:
            box, room = goal.group(1), goal.group(2)
            self.plan = [
                f"focus on {thing}",
                f"pick up {thing}",
                f"open door to {room}",
                f"go to {room}",
                f"move {thing} to {box}",
            ]

    def act(self, observation: str) -> str:
        return self.plan.pop(0) if self.plan else "look around"


class AlfWorldPolicy:
    """Pick-and-place: visits the receptacles named in the first observation
    until one shows the object, takes it, goes to the target and puts it.
    (After reset the client shows the available actions; after a step it
    shows only the observation, so the plan is read from the text.)"""

    def __init__(self) -> None:
        self.obj = ""
        self.target = ""
        self.to_visit: list[str] = []
        self.location = ""
        self.holding = ""

    def start(self, observation: str) -> None:
        task = re.search(r"put an? (\w+) in (\w+)", observation)
        if task:
            self.obj, self.target = task.group(1), task.group(2)
        seen = re.search(r"you see (.+?)\.\n", observation)
        if seen:
            self.to_visit = [r.strip()[2:] for r in re.split(r",|\band\b", seen.group(1)) if r.strip()]

    def act(self, observation: str) -> str:
        if self.holding:
            if not self.location.startswith(self.target):
                self.location = f"{self.target} 1"
                return f"go to {self.location}"
            return f"put {self.holding} in/on {self.location}"
        found = re.search(rf"\b({self.obj} \d+)", observation) if self.obj else None
        if found and self.location:
            self.holding = found.group(1)
            return f"take {self.holding} from {self.location}"
        if self.to_visit:
            self.location = self.to_visit.pop(0)
            return f"go to {self.location}"
        return "look"


class WebShopPolicy:
    """Searches for the instruction, clicks the first product, buys it."""

    def __init__(self) -> None:
        self.query = ""

    def start(self, observation: str) -> None:
        m = re.search(r"Instruction: \[SEP\] (.+?)(?:, and price| \[SEP\])", observation)
        self.query = m.group(1) if m else "red running shoes"

    def act(self, observation: str) -> str:
        if "Buy Now" in observation:
            return "click[buy now]"
        asin = re.search(r"\[SEP\] (B0[0-9A-Z]{8}) \[SEP\]", observation)
        if asin:
            return f"click[{asin.group(1).lower()}]"
        return f"search[{self.query}]"


class SearchQAPolicy:
    """Searches for the question, then answers with the first passage's title."""

    def __init__(self) -> None:
        self.question = ""

    def start(self, observation: str) -> None:
        m = re.search(r"Question: (.+)$", observation, re.M)
        self.question = m.group(1).strip() if m else "capital of france"

    def act(self, observation: str) -> str:
        title = re.search(r'Doc 1\(Title: "?([^")]+)"?\)', observation)
        if title:
            return f"<answer> {title.group(1)} </answer>"
        return f"<search> {self.question} </search>"


class ExpertPolicy:
    """``--policy expert``, for ``--target agentrl``: every action is the one
    ``agentrl serve``'s expert gives for the session the client created last
    (``GET /expert_action?id=``, not recorded), written as the env's client
    expects it. The scripted policies above read AgentGym's observation
    wording, which agentrl's envs do not copy."""

    def __init__(self, rec: Recorder, env: str) -> None:
        self.rec = rec
        self.env = env

    def start(self, observation: str) -> None:
        pass

    def act(self, observation: str) -> str:
        sid = self.rec.last_session_id()
        resp = self.rec._get(f"{self.rec.base}/expert_action", params={"id": sid}, timeout=TIMEOUT_S)
        action = resp.json().get("action") if resp.status_code == 200 else None
        if not action:
            return "look"
        if self.env == "searchqa":
            m = re.match(r"(search|answer)\[(.*)\]$", action, re.S)
            if m:
                return f"<{m.group(1)}> {m.group(2)} </{m.group(1)}>"
        return action


def think_then(action: str) -> str:
    """A reply in SearchQA's own format (its client sends the reply as is)."""
    return f"<think>I follow my plan.</think>\n{action}"


# --------------------------------------------------------------------- envs


@dataclass
class EnvCase:
    """One AgentGym env: its client, server package and scripted episode."""

    name: str
    # agentenv's class-name prefix: `<prefix>EnvClient`, `<prefix>Task`.
    prefix: str
    make_policy: Callable[[], Any]
    reset_idx: int  # data_idx of the client scenario
    task_idx: int  # data_idx of the BaseTask scenario
    invalid_action: str
    # The first valid step, when the policy's first move would already end
    # the episode (so that the invalid action still comes before done).
    first_action: Optional[str] = None
    max_steps: int = 12
    # How an LLM reply carrying the action looks for this env's client.
    reply: Callable[[str], str] = react
    # Run AgentGym's server with substitutes.py (its data cannot be had here).
    substitute: bool = False
    # Facts about the transcript a replay must know (nondeterminism).
    notes: list[str] = field(default_factory=list)
    probes: Callable[["Scenario"], None] = lambda s: None

    @property
    def package_dir(self) -> str:
        """The server's directory in the AgentGym checkout."""
        return f"agentenv-{self.name}"

    @property
    def module(self) -> str:
        return f"agentenv_{self.name}"


class Scenario:
    """Runs one env's scenario against a base URL and records it."""

    def __init__(
        self, case: EnvCase, base: str, agentenv: Any, requests_module: Any, expert: bool = False
    ) -> None:
        self.case = case
        self.base = base.rstrip("/")
        self.envs = agentenv
        self.requests = requests_module
        self.rec = Recorder(requests_module, self.base)
        self.make_policy: Callable[[], Any] = (
            (lambda: ExpertPolicy(self.rec, case.name)) if expert else case.make_policy
        )

    # ----- helpers

    def attempt(self, phase: str, fn: Callable[[], Any], describe: bool = True) -> tuple[bool, Any]:
        """Run a client call; log what it returned or raised."""
        self.rec.set_phase(phase)
        try:
            value = fn()
        except Exception as e:  # the client's failure is what we record
            self.rec.note(client_exception=f"{type(e).__name__}: {e}".strip())
            return False, None
        if describe:
            self.rec.note(client_returned=describe_value(value, self.rec))
        return True, value

    def raw(self, phase: str, method: str, path: str, body: Any = NO_BODY, query: str = "") -> Any:
        """A request the clients never send, recorded like theirs."""
        self.rec.set_phase(phase)
        url = f"{self.base}{path}{query}"
        if method == "GET":
            return self.requests.get(url, timeout=TIMEOUT_S)
        if body is NO_BODY:
            return self.requests.post(url, timeout=TIMEOUT_S)
        return self.requests.post(url, json=body, timeout=TIMEOUT_S)

    # ----- the scenario

    def run(self) -> list[dict[str, Any]]:
        self.rec.install()
        try:
            self.client_episode()
            self.task_loop()
            self.case.probes(self)
        finally:
            self.rec.uninstall()
        return self.rec.entries

    def client_episode(self) -> None:
        case = self.case
        cls = getattr(self.envs, f"{case.prefix}EnvClient")
        args = {"env_server_base": self.base, "data_len": 1, "timeout": TIMEOUT_S}
        ok, client = self.attempt("client.create", lambda: cls(**args), describe=False)
        if not ok:
            return
        self.attempt("client.reset", lambda: client.reset(case.reset_idx))
        ok, observation = self.attempt("client.observe", client.observe)
        policy = self.make_policy()
        observation = observation if isinstance(observation, str) else ""
        policy.start(observation)
        # One valid step, then an invalid action, then on to done.
        first = case.first_action or policy.act(observation)
        ok, out = self.attempt("client.step.valid", lambda: client.step(case.reply(first)))
        done = bool(ok and out.done)
        observation = out.state if ok else observation
        if not done:
            ok, _ = self.attempt(
                "client.step.invalid", lambda: client.step(case.reply(case.invalid_action))
            )
        # On to done even when a call failed: the client object stays usable,
        # and what the server does next is part of the record.
        steps = 0
        while not done and steps < case.max_steps:
            ok, out = self.attempt(
                "client.step.to_done", lambda: client.step(case.reply(policy.act(observation)))
            )
            if ok:
                done, observation = out.done, out.state
            steps += 1
        if done:
            self.attempt(
                "client.step.after_done", lambda: client.step(case.reply(policy.act(observation)))
            )
        else:
            self.rec.set_phase("client.step.to_done")
            self.rec.note(client_returned=f"not done after {steps} steps")
        self.attempt("client.close", client.close)
        self.attempt("client.close.again", client.close)

    def task_loop(self) -> None:
        case = self.case
        task_cls = getattr(self.envs, f"{case.prefix}Task")
        agent = make_scripted_agent(self.make_policy(), case.reply)
        client_args = {"env_server_base": self.base, "data_len": 1, "timeout": TIMEOUT_S}
        ok, task = self.attempt(
            "task.create", lambda: task_cls(client_args=client_args, n_clients=1), describe=False
        )
        if not ok:
            return
        ok, experiences = self.attempt(
            "task.generate_experience",
            lambda: task.generate_experience(agent, [case.task_idx], max_rounds=case.max_steps),
            describe=False,
        )
        if ok:
            exp = experiences[0]
            self.rec.note(
                client_returned={
                    "reward": exp.reward,
                    "messages": len(exp.conversation),
                    "last_message": exp.conversation[-1]["content"][:200],
                }
            )
        self.attempt("task.close", task.clients[0].close)


def describe_value(value: Any, rec: Recorder) -> Any:
    """What a client call returned, without repeating a response body."""
    last = next((e for e in reversed(rec.entries) if "status" in e), None)
    last_body = last.get("response") if last else None
    if hasattr(value, "state") and hasattr(value, "reward"):
        state = value.state
        if isinstance(last_body, dict) and state in (last_body.get("observation"), last_body.get("state")):
            state = "<the response's observation>"
        return {"state": state, "reward": value.reward, "done": value.done}
    if value is not None and value == last_body:
        return "<the response body>"
    if isinstance(value, str) and isinstance(last_body, dict) and value == last_body.get("observation"):
        return "<the last response's observation>"
    return value


def make_scripted_agent(policy: Any, reply: Callable[[str], str]) -> Any:
    """An AgentGym ``APIAgent`` whose replies come from ``policy`` instead of
    a model: BaseTask drives it exactly as it drives an API model."""
    from agentenv.controller import APIAgent

    class ScriptedAgent(APIAgent):
        def __init__(self) -> None:  # no OpenAI client: nothing to call
            self.turn = 0

        def generate(self, conversation):  # noqa: D401 - AgentGym's signature
            observation = conversation[-1]["content"]
            if self.turn == 0:
                policy.start(observation)
            self.turn += 1
            return reply(policy.act(observation)), None

    return ScriptedAgent()


# --------------------------------------------------------------------- probes


def probes_textcraft(s: Scenario) -> None:
    r = s.raw("probe.create.no_body", "POST", "/create")
    r = s.raw("probe.create.empty_object", "POST", "/create", {})
    sid = safe_id(r)
    s.raw("probe.reset.no_data_idx", "POST", "/reset", {"id": sid})
    s.raw("probe.reset.huge_data_idx", "POST", "/reset", {"id": sid, "data_idx": 2**31})
    s.raw("probe.observation", "GET", "/observation", query=f"?id={sid}")
    s.raw("probe.step.missing_action", "POST", "/step", {"id": sid})
    s.raw("probe.step.unknown_id", "POST", "/step", {"id": 999, "action": "inventory"})
    s.raw("probe.close", "POST", "/close", {"id": sid})


def probes_babyai(s: Scenario) -> None:
    r = s.raw("probe.create.no_body", "POST", "/create")
    sid = safe_id(r)
    s.raw("probe.observation.before_reset", "GET", "/observation", query=f"?id={sid}")
    s.raw("probe.reset.no_data_idx", "POST", "/reset", {"id": sid})
    s.raw("probe.reset.level_40", "POST", "/reset", {"id": sid, "data_idx": 39})
    s.raw("probe.observation", "GET", "/observation", query=f"?id={sid}")
    s.raw("probe.step.unknown_id", "POST", "/step", {"id": 999, "action": "turn left"})
    s.raw("probe.close", "POST", "/close", {"id": sid})


def probes_sciworld(s: Scenario) -> None:
    r = s.raw("probe.create.no_body", "POST", "/create")
    sid = safe_id(r)
    s.raw("probe.step.before_reset", "POST", "/step", {"id": sid, "action": "look around"})
    s.raw("probe.reset.last_data_idx", "POST", "/reset", {"id": sid, "data_idx": 4638})
    s.raw("probe.reset.data_idx_out_of_range", "POST", "/reset", {"id": sid, "data_idx": 4639})
    s.raw("probe.reset.huge_data_idx", "POST", "/reset", {"id": sid, "data_idx": 2**31})
    s.raw("probe.reset.no_data_idx", "POST", "/reset", {"id": sid})
    s.raw("probe.observation", "GET", "/observation", query=f"?id={sid}")
    # Focusing on the wrong thing ends a task with score -100.
    s.raw("probe.reset.boil", "POST", "/reset", {"id": sid, "data_idx": 0})
    s.raw("probe.step.wrong_focus", "POST", "/step", {"id": sid, "action": "focus on picture"})
    s.raw("probe.step.unknown_id", "POST", "/step", {"id": 999, "action": "look around"})
    s.raw("probe.close", "POST", "/close", {"id": sid})
    s.raw("probe.close.unknown_id", "POST", "/close", {"id": 999})


def probes_alfworld(s: Scenario) -> None:
    r = s.raw("probe.create.no_body", "POST", "/create")
    sid = safe_id(r)
    s.raw("probe.observation.before_reset", "GET", "/observation", query=f"?id={sid}")
    s.raw("probe.reset.data_idx_instead_of_game", "POST", "/reset", {"id": sid, "data_idx": 0})
    s.raw("probe.reset.bad_world_type", "POST", "/reset", {"id": sid, "game": 0, "world_type": "Real"})
    s.raw("probe.reset.game_out_of_range", "POST", "/reset", {"id": sid, "game": 2620, "world_type": "Text"})
    s.raw("probe.reset", "POST", "/reset", {"id": sid, "game": 5, "world_type": "Text"})
    s.raw("probe.observation", "GET", "/observation", query=f"?id={sid}")
    s.raw("probe.available_actions", "GET", "/available_actions", query=f"?id={sid}")
    s.raw("probe.step.unknown_id", "POST", "/step", {"id": 999, "action": "look"})


def probes_webshop(s: Scenario) -> None:
    r = s.raw("probe.create.no_body", "POST", "/create")
    sid = safe_id(r)
    s.raw("probe.reset.no_session_id", "POST", "/reset", {"env_idx": sid})
    s.raw("probe.reset.id_instead_of_env_idx", "POST", "/reset", {"id": sid, "session_id": 3})
    s.raw("probe.available_actions", "GET", "/available_actions", query=f"?env_idx={sid}")
    s.raw("probe.instruction_text", "GET", "/instruction_text", query=f"?env_idx={sid}")
    s.raw("probe.observation.by_id", "GET", "/observation", query=f"?id={sid}")


def probes_searchqa(s: Scenario) -> None:
    s.raw("probe.create.no_body", "POST", "/create")
    r = s.raw("probe.create.item_out_of_range", "POST", "/create", {"id": 221328})
    r = s.raw("probe.create", "POST", "/create", {"id": 2})
    sid = safe_id(r)
    s.raw("probe.reset.no_item_id", "POST", "/reset", {"env_idx": sid})
    s.raw("probe.reset", "POST", "/reset", {"env_idx": sid, "id": 51713})
    s.raw("probe.observation", "GET", "/observation", query=f"?env_idx={sid}")
    s.raw("probe.step.unknown_env_idx", "POST", "/step", {"env_idx": 999, "action": "<answer> x </answer>"})
    s.raw("probe.close", "POST", "/close", {"env_idx": sid})
    s.raw("probe.close.again", "POST", "/close", {"env_idx": sid})


def safe_id(resp: Any) -> Any:
    try:
        body = resp.json()
    except ValueError:
        return 0
    if isinstance(body, dict):
        return body.get("id", 0)
    return body


# One row per env: name, class-name prefix, policy, then what differs.
CASES: dict[str, EnvCase] = {case.name: case for case in [
    EnvCase("textcraft", "TextCraft", TextCraftPolicy, reset_idx=0, task_idx=1,
            invalid_action="fly to the moon", probes=probes_textcraft, notes=[
                "The crafting commands come from a Python set: their order follows string "
                "hashing; captured with PYTHONHASHSEED=0 on the server.",
                "create resets the new env with data_idx = its session id.",
            ]),
    EnvCase("babyai", "BabyAI", BabyAIPolicy, reset_idx=0, task_idx=1, invalid_action="jump",
            first_action="turn left", probes=probes_babyai),
    # find-non-living-thing, variation 0, whose plan SciWorldPolicy knows
    # (the flat task list of AgentGym's server: 4639 entries, data_idx 0..4638).
    EnvCase("sciworld", "Sciworld", SciWorldPolicy, reset_idx=3236, task_idx=3236,
            invalid_action="jump around", probes=probes_sciworld),
    # task_idx: the first of the 200 test games (data_idx 2420..2619).
    EnvCase("alfworld", "AlfWorld", AlfWorldPolicy, reset_idx=0, task_idx=2420,
            invalid_action="fly to the moon", substitute=True, probes=probes_alfworld),
    EnvCase("webshop", "Webshop", WebShopPolicy, reset_idx=0, task_idx=1, invalid_action="fly[moon]",
            substitute=True, probes=probes_webshop, notes=[
                "Session ids are random: create answers random.randint(0, 48950076) after "
                "random.seed(time.time()), so they differ on every capture; treat them as opaque.",
                "AgentGym's WebShop server has no /close route; the client retries a non-200 answer 5 times.",
            ]),
    # task_idx: the first train item (test: 0..51712, train: 51713..221327).
    EnvCase("searchqa", "SearchQA", SearchQAPolicy, reset_idx=0, task_idx=51713,
            invalid_action="I do not know.", reply=think_then, substitute=True, probes=probes_searchqa),
]}


# --------------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(url: str, proc: subprocess.Popen, seconds: float) -> None:
    import requests

    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before answering {url}")
        try:
            requests.get(url, timeout=2)
            return
        except requests.RequestException:
            time.sleep(0.5)
    raise RuntimeError(f"no answer from {url} after {seconds}s")


class Server:
    """A server process on 127.0.0.1, stopped (with its children) on exit."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> None:
        self.log = open(log, "w")
        self.proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            # The server runs in its own process group: SciWorld's JVM goes too.
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def start_agentgym_server(case: EnvCase, agentgym: Path, logs: Path) -> tuple[Server, str]:
    port = free_port()
    pkg = agentgym / case.package_dir
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(pkg), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    # TextCraft builds its command list from a Python set: its order (and so
    # the observation text) follows string hashing, random per process unless fixed.
    env["PYTHONHASHSEED"] = "0"
    # TextCraft reads its recipes from the relative path "agentenv_textcraft/":
    # the server must run in its package directory, as its README's launch does.
    if case.substitute:
        argv = [sys.executable, str(Path(__file__).with_name("substitutes.py")), case.name,
                "--agentgym", str(agentgym), "--port", str(port)]
    else:
        argv = [sys.executable, "-m", "uvicorn", f"{case.module}:app", "--host", "127.0.0.1", "--port", str(port)]
    server = Server(argv, cwd=pkg, env=env, log=logs / f"agentgym-{case.name}.log")
    return start_server(server, port, "/")


def start_agentrl_server(binary: Path, logs: Path) -> tuple[Server, str]:
    port = free_port()
    argv = [str(binary), "serve", "--host", "127.0.0.1", "--port", str(port)]
    server = Server(argv, cwd=REPO_ROOT, env=dict(os.environ), log=logs / "agentrl-serve.log")
    return start_server(server, port, "/health")


def start_server(server: Server, port: int, health: str) -> tuple[Server, str]:
    """The started `server` and its base URL once `health` answers (stopped if it never does)."""
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(base + health, server.proc, 120)
    except Exception:
        server.stop()
        raise
    return server, base


# --------------------------------------------------------------------- main


def judge(entries: list[dict[str, Any]]) -> list[str]:
    """What kept the client scenario and BaseTask's loop from a clean run:
    a client exception outside the probes, no episode end, no experience."""
    # A step after done raises in BabyAI's and ALFWorld's clients against
    # AgentGym's own servers too (their `{"error": …}` has no observation).
    problems = [
        f"{e['phase']}: {e['client_exception']}"
        for e in entries
        if "client_exception" in e
        and not e["phase"].startswith("probe.")
        and e["phase"] != "client.step.after_done"
    ]
    if not any(e.get("phase") == "client.step.after_done" for e in entries):
        problems.append("the client's episode never reached done")
    experience = [
        e["client_returned"]
        for e in entries
        if e.get("phase") == "task.generate_experience" and "client_returned" in e
    ]
    if not experience:
        problems.append("BaseTask.generate_experience returned nothing")
    return problems


def agentgym_commit(agentgym: Path) -> Optional[str]:
    marker = agentgym / "COMMIT"
    if marker.exists():
        return marker.read_text().strip()
    try:
        return subprocess.run(
            ["git", "-C", str(agentgym), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def package_versions(names: list[str]) -> dict[str, str]:
    from importlib import metadata

    out = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            pass
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agentgym", type=Path, required=True, help="an AgentGym checkout (its repo root)")
    ap.add_argument("--target", choices=["agentgym", "agentrl"], default="agentgym")
    ap.add_argument("--agentrl-bin", type=Path, default=REPO_ROOT / "target" / "debug" / "agentrl")
    ap.add_argument(
        "--policy",
        choices=["scripted", "expert"],
        default="scripted",
        help="expert (with --target agentrl): actions from agentrl serve's GET /expert_action",
    )
    ap.add_argument("--envs", default=None, help="comma-separated; default: all the target can run")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--logs", type=Path, default=Path("/tmp/agentgym-capture-logs"))
    args = ap.parse_args()

    agentgym = args.agentgym.resolve()
    sys.path.insert(0, str(agentgym / "agentenv"))
    import requests

    import agentenv.envs as agentenv_envs

    names = args.envs.split(",") if args.envs else ALL_ENVS
    for n in names:
        if n not in CASES:
            ap.error(f"unknown env {n!r} (known: {', '.join(CASES)})")
    out = args.out or (DEFAULT_OUT if args.target == "agentgym" else None)
    if out is None:
        ap.error("--out is required with --target agentrl")
    if args.policy == "expert" and args.target != "agentrl":
        ap.error("--policy expert needs --target agentrl (AgentGym's servers have no expert)")
    out.mkdir(parents=True, exist_ok=True)
    args.logs.mkdir(parents=True, exist_ok=True)

    meta = {
        "agentgym_commit": agentgym_commit(agentgym),
        "python": platform.python_version(),
        "packages": package_versions(
            ["fastapi", "pydantic", "uvicorn", "requests", "scienceworld", "minigrid", "gymnasium", "gym"]
        ),
    }
    shared = None
    if args.target == "agentrl":
        shared = start_agentrl_server(args.agentrl_bin.resolve(), args.logs)
    failures = 0
    try:
        for name in names:
            case = CASES[name]
            server = None
            if shared is None:
                server, base = start_agentgym_server(case, agentgym, args.logs)
            else:
                base = f"{shared[1]}/{name}"
            try:
                entries = Scenario(
                    case, base, agentenv_envs, requests, expert=args.policy == "expert"
                ).run()
            except Exception:
                traceback.print_exc()
                failures += 1
                continue
            finally:
                if server is not None:
                    server.stop()
            if args.target == "agentrl":
                backend = "agentrl serve"
            elif case.substitute:
                backend = "substitute (scripts/agentgym/substitutes.py stands in for the data sets)"
            else:
                backend = "agentgym"
            doc = {
                "env": name,
                "server": "agentgym" if args.target == "agentgym" else "agentrl serve",
                "backend": backend,
                "notes": case.notes,
                "base_path": "/" if args.target == "agentgym" else f"/{name}",
                "captured_with": meta,
                "exchanges": entries,
            }
            path = out / f"{name}.json"
            path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
            print(f"{name}: {len(entries)} entries -> {path} ({path.stat().st_size} bytes)")
            verdict = judge(entries)
            print(f"{name}: {'PASS' if not verdict else 'FAIL: ' + '; '.join(verdict)}")
            failures += bool(verdict) and args.target == "agentrl"
    finally:
        if shared is not None:
            shared[0].stop()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
