#!/usr/bin/env python3
"""Run AgentGym's ALFWorld, WebShop or SearchQA env server with a small
stand-in for the part that needs downloaded data, so that AgentGym's clients
can be recorded against AgentGym's real HTTP layer.

Real (AgentGym's code, unchanged): the FastAPI app and its pydantic models
(``server.py``, ``model.py``), and the session wrapper that turns the
environment into JSON (``env_wrapper.py`` / ``environment.py``: ids, error
payloads, ``data_idx`` ranges, SearchQA's action parsing and exact-match
reward). Stand-in (this file): only what reads the data sets —

* ALFWorld: ``agentenv_alfworld.environment.SingleAlfredTWEnv`` (TextWorld
  games from ``alfworld-download``) -> one tiny 'put a mug in a cabinet' game;
* WebShop: ``gym.make("WebAgentTextEnv-v0")`` (WebShop's product catalogue,
  search index and goals) -> a four-page shop with one product;
* SearchQA: the dense retriever (e5 model, Wikipedia index) and the query
  parquet files -> one canned passage and three questions.

So in these transcripts request and response *shapes*, status codes, ids and
error bodies are AgentGym's; observation *texts* and rewards of ALFWorld and
WebShop are the stand-in's (marked ``"backend": "substitute"``).

Usage: substitutes.py ENV --agentgym DIR --port PORT (binds 127.0.0.1 only).
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

# ------------------------------------------------------------------ ALFWorld

ALFWORLD_WELCOME = "-= Welcome to TextWorld, ALFRED! =-"
ALFWORLD_ROOM = (
    "You are in the middle of a room. Looking quickly around you, you see "
    "a cabinet 1, a countertop 1, and a drawer 1."
)


class AlfredGame:
    """One game in the shape of alfworld's batched TextWorld env: lists in,
    lists out, ``info["won"]`` and ``info["admissible_commands"]``."""

    def __init__(self, game_file: str) -> None:
        self.game_file = game_file
        self.location = None
        self.holding = False
        self.mug_at = "countertop 1"

    def commands(self) -> list[str]:
        cmds = [f"go to {r}" for r in ("cabinet 1", "countertop 1", "drawer 1") if r != self.location]
        if self.location and self.location == self.mug_at and not self.holding:
            cmds.append(f"take mug 1 from {self.location}")
        if self.holding and self.location:
            cmds.append(f"put mug 1 in/on {self.location}")
        return cmds + ["inventory", "look"]

    def info(self, won: bool) -> dict:
        return {
            "won": [won],
            "admissible_commands": [self.commands()],
            "extra.gamefile": [self.game_file],
        }

    def reset(self):
        self.location, self.holding, self.mug_at = None, False, "countertop 1"
        ob = f"{ALFWORLD_WELCOME}\n\n{ALFWORLD_ROOM}\n\nYour task is to: put a mug in cabinet."
        return [ob], self.info(False)

    def step(self, actions: list[str]):
        action = actions[0]
        won = False
        if action.startswith("go to ") and f"go to {action[6:]}" in self.commands():
            self.location = action[6:]
            seen = "a mug 1" if self.mug_at == self.location else "nothing"
            ob = f"You arrive at loc 3. On the {self.location}, you see {seen}."
        elif action == f"take mug 1 from {self.location}" and action in self.commands():
            self.holding, self.mug_at = True, None
            ob = f"You pick up the mug 1 from the {self.location}."
        elif action == f"put mug 1 in/on {self.location}" and action in self.commands():
            self.holding, self.mug_at = False, self.location
            ob = f"You put the mug 1 in/on the {self.location}."
            won = self.location == "cabinet 1"
        elif action == "inventory":
            ob = "You are carrying: a mug 1." if self.holding else "You are not carrying anything."
        elif action == "look":
            ob = ALFWORLD_ROOM
        else:
            ob = "Nothing happens."
        return [ob], [0], [won], self.info(won)

    def close(self) -> None:
        pass


class SingleAlfredTWEnv:
    """Stand-in for agentenv_alfworld.environment.SingleAlfredTWEnv."""

    def __init__(self, config: dict) -> None:
        self.config = config
        self.game_files: list[str] = []
        self.num_games = 0

    def init_env(self, batch_size: int = 1) -> AlfredGame:
        return AlfredGame(self.game_files[0])


def install_alfworld() -> None:
    module = types.ModuleType("agentenv_alfworld.environment")
    module.SingleAlfredTWEnv = SingleAlfredTWEnv
    sys.modules["agentenv_alfworld.environment"] = module


# ------------------------------------------------------------------ WebShop

WEBSHOP_INSTRUCTION = "i need red running shoes, and price lower than 50.00 dollars"


class WebShopTextEnv:
    """Stand-in for WebShop's ``WebAgentTextEnv`` in ``observation_mode="text"``:
    search page -> results -> item -> bought (reward 1.0). Like the real env,
    an action it cannot perform changes nothing and answers reward 0, not done."""

    def __init__(self, **kwargs) -> None:
        self.session = None
        self.page = "search"

    def reset(self, session=None):
        self.session = session
        self.page = "search"
        return self.observation, None

    @property
    def observation(self) -> str:
        if self.page == "search":
            return f"WebShop [SEP] Instruction: [SEP] {WEBSHOP_INSTRUCTION} [SEP] Search"
        if self.page == "results":
            return (
                f"Instruction: [SEP] {WEBSHOP_INSTRUCTION} [SEP] Back to Search [SEP] "
                "Page 1 (Total results: 1) [SEP] B0TESTSHOE [SEP] Red Running Shoes [SEP] $39.99"
            )
        if self.page == "item":
            return (
                f"Instruction: [SEP] {WEBSHOP_INSTRUCTION} [SEP] Back to Search [SEP] < Prev [SEP] "
                "Red Running Shoes [SEP] Price: $39.99 [SEP] Rating: N.A. [SEP] Description [SEP] Buy Now"
            )
        return (
            "Thank you for shopping with us! [SEP] Your code: [SEP] None [SEP] "
            "Your score (min 0.0, max 1.0) [SEP] 1.0"
        )

    def get_available_actions(self) -> dict:
        clickables = {
            "search": ["search"],
            "results": ["back to search", "b0testshoe"],
            "item": ["back to search", "< prev", "description", "buy now"],
            "done": [],
        }[self.page]
        return {"has_search_bar": self.page == "search", "clickables": clickables}

    def get_instruction_text(self) -> str:
        return f"Instruction: {WEBSHOP_INSTRUCTION}"

    @property
    def state(self) -> dict:
        return {"url": f"http://127.0.0.1:3000/{self.session}", "html": "", "instruction_text": self.get_instruction_text()}

    def step(self, action: str):
        reward, done = 0.0, False
        act = action.strip().lower()
        clickables = self.get_available_actions()["clickables"]
        if act.startswith("search[") and act.endswith("]") and self.page == "search" and len(act) > 8:
            self.page = "results"
        elif act.startswith("click[") and act.endswith("]") and act[6:-1] in clickables:
            target = act[6:-1]
            if target == "back to search":
                self.page = "search"
            elif target == "b0testshoe":
                self.page = "item"
            elif target == "< prev":
                self.page = "results"
            elif target == "buy now":
                self.page, reward, done = "done", 1.0, True
        return self.observation, reward, done, None

    def close(self) -> None:
        pass


def install_webshop() -> None:
    gym = types.ModuleType("gym")
    gym.make = lambda env_id, **kwargs: WebShopTextEnv(**kwargs)
    sys.modules["gym"] = gym
    site = types.ModuleType("web_agent_site")
    envs = types.ModuleType("web_agent_site.envs")
    envs.WebAgentTextEnv = WebShopTextEnv
    site.envs = envs
    sys.modules["web_agent_site"] = site
    sys.modules["web_agent_site.envs"] = envs


# ------------------------------------------------------------------ SearchQA

SEARCHQA_QUESTIONS = [
    ("what is the capital of france?", ["Paris"]),
    ("who wrote the novel 1984?", ["George Orwell", "Orwell"]),
    ("what is the chemical symbol for gold?", ["Au"]),
]
# Row counts of AgentGym's test and train parquet files (its ITEM_RANGE).
SEARCHQA_SIZES = {"test": 51713, "train": 221328 - 51713}


class QueryRows:
    """A parquet split of the right length whose rows cycle the questions above."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < self.size:
            raise IndexError(f"Index {i} out of range for dataset of size {self.size}.")
        question, answers = SEARCHQA_QUESTIONS[i % len(SEARCHQA_QUESTIONS)]
        return {"question": question, "reward_model": {"ground_truth": {"target": answers}}}


class Retriever:
    """Stand-in for the e5 dense retriever: the same passage for every query."""

    def search(self, query, num=3, return_score=False):
        docs = [{"contents": '"Paris"\nParis is the capital and most populous city of France.'}] * num
        scores = [0.9] * num
        return (docs, scores) if return_score else docs


def install_searchqa() -> None:
    datasets = types.ModuleType("datasets")

    def load_dataset(kind, data_files=None, **kwargs):
        split = "test" if str(data_files).endswith("test.parquet") else "train"
        return {"train": QueryRows(SEARCHQA_SIZES[split])}

    datasets.load_dataset = load_dataset
    sys.modules["datasets"] = datasets
    retriever = types.ModuleType("agentenv_searchqa.retriever")
    retriever.get_retriever = lambda config: Retriever()
    sys.modules["agentenv_searchqa.retriever"] = retriever


# ------------------------------------------------------------------ main

INSTALL = {
    "alfworld": ("agentenv-alfworld", "agentenv_alfworld", install_alfworld),
    "webshop": ("agentenv-webshop", "agentenv_webshop", install_webshop),
    "searchqa": ("agentenv-searchqa", "agentenv_searchqa", install_searchqa),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("env", choices=sorted(INSTALL))
    ap.add_argument("--agentgym", type=Path, required=True)
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    package_dir, module, install = INSTALL[args.env]
    sys.path.insert(0, str(args.agentgym.resolve() / package_dir))
    install()
    import importlib

    import uvicorn

    app = importlib.import_module(module).app
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
