#!/usr/bin/env python3
"""Score option and attribute cases with WebShop's own reward code and write
them as a fixture the Rust tests replay (crates/env-webshop/tests/data/
reward_cases.json).

Needs WebShop's source (e.g. AgentGym's agentenv-webshop/webshop) and
`pip install thefuzz rich`; spaCy is not needed, because only
get_option_reward and get_attribute_reward are called (a stand-in spaCy
module satisfies goal.py's import). Not part of CI:

    python3 scripts/webshop/reward_cases.py --webshop PATH/TO/webshop \
        --out crates/env-webshop/tests/data/reward_cases.json
"""

import argparse
import json
import random
import sys
import types


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--webshop", required=True, help="WebShop's root (holds web_agent_site/)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", type=int, default=300)
    args = ap.parse_args()
    sys.modules["spacy"] = types.SimpleNamespace(load=lambda name: None)
    sys.path.insert(0, args.webshop)
    from web_agent_site.engine.goal import get_attribute_reward, get_option_reward

    rng = random.Random(233)
    names = ["color", "size", "style", "flavor", "roast", "scent", "length", "capacity"]
    values = [
        "black", "navy", "navy blue", "dark blue", "light grey", "olive", "red", "white",
        "kickstand", "standard", "peppermint", "lemon ginger", "dark roast", "light roast",
        "x-large", "xl", "large", "small", "medium", "x large tall", "7", "7.5", "8 wide",
        "3 feet", "10 feet", "18 ounce", "queen", "king", "card holder", "clear back",
        "vanilla", "sea salt", "size", "color",
    ]
    options = []
    for _ in range(args.cases):
        k = rng.randint(1, 3)
        goal_names = rng.sample(names, k)
        goal = {n: rng.choice(values) for n in goal_names}
        as_dict = rng.random() < 0.7
        chosen = [rng.choice(values) for _ in range(rng.randint(0, 3))]
        if rng.random() < 0.5:
            chosen += list(goal.values())[: rng.randint(0, k)]
        goal_options = goal if as_dict else list(goal.values())
        _, matches = get_option_reward(
            chosen, goal_options.items() if isinstance(goal_options, dict) else goal_options
        )
        options.append({
            "chosen": chosen,
            # [name, value]; name "" when WebShop's goal_options is a list.
            "goal": [[n if as_dict else "", v] for n, v in goal.items()],
            "matches": matches,
        })

    attr_pool = ["gluten free", "fair trade", "organic", "caffeine free", "machine wash",
                 "long lasting", "easy clean", "high quality", "non slip", "water resistant",
                 "dairy free", "wash cold"]
    attributes = []
    for _ in range(args.cases // 2):
        product = {
            "Attributes": rng.sample(attr_pool, rng.randint(0, 3)),
            "Title": rng.choice(["Kestrel Organic Coffee", "Non-Slip Yoga Mat, High Quality",
                                 "Machine Wash Cotton Tee", "Zenora Tea"]),
            "BulletPoints": rng.sample(["Fair trade certified", "easy clean surface",
                                        "Dairy Free recipe", "long lasting scent"], rng.randint(0, 2)),
            "Description": rng.choice(["", "Water resistant and light.", "wash cold, tumble dry"]),
        }
        goal = {"attributes": rng.sample(attr_pool, rng.randint(1, 3))}
        _, matches = get_attribute_reward(product, goal)
        attributes.append({"product": product, "goal": goal["attributes"], "matches": matches})

    with open(args.out, "w") as f:
        json.dump({"source": "WebShop engine/goal.py via scripts/webshop/reward_cases.py",
                   "options": options, "attributes": attributes}, f, indent=0)
    print(f"wrote {len(options)} option and {len(attributes)} attribute cases to {args.out}")


if __name__ == "__main__":
    main()
