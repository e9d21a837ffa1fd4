"""The MoE steps and HF generate runs recorded on a card (benchmarks/results/values_card_*.json, made by
`make gpu-check`'s device call for issue 45) run again on the virtual GPU of the same model, under each routing,
against the card's peaks; prints JSON.

    python benchmarks/values_vs_card.py benchmarks/results/values_card_h100_torch2.11.json [--out FILE]

Run it with the card's torch: the caching allocator's behaviour is the installed torch's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from _common import emit, environment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROUTINGS = ("balanced", "worst")


def dry_run(command: list[str], gpu: str, routing: str | None) -> dict:
    run = [sys.executable, "-m", "allocscope", "run", "--gpu", gpu, "--no-record"]
    if routing:
        run += ["--routing", routing]
    p = subprocess.run([*run, "--", sys.executable, *command], capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        return {"routing": routing, "status": p.returncode, "stderr": p.stderr[-1500:]}
    out = json.loads(p.stdout.strip().splitlines()[-1])
    return {"routing": routing, **{k: out[k] for k in ("max_reserved", "max_allocated", "tokens_per_expert",
                                                       "forward_passes", "new_tokens") if k in out}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("card", help="the card's results (values_card_*.json)")
    parser.add_argument("--gpu", default="H100-80GB")
    parser.add_argument("--out")
    args = parser.parse_args()
    with open(args.card) as f:
        card = json.load(f)
    report = {"benchmark": "values_vs_card", **environment(), "card": os.path.relpath(args.card, ROOT),
              "card_device": card["device"], "card_torch": card["torch"], "runs": []}
    for kind in ("moe", "generate"):
        for ran in card[kind]:
            command = ran["command"].split()[1:]  # (python3 on the card)
            if kind == "moe" and int(ran.get("hidden", 0)) < 1024:
                continue  # the small runs check the exact mode's routing (tests/integration/test_values.py)
            routings = ROUTINGS if kind == "moe" else (None,)
            dry = [dry_run(command, args.gpu, r) for r in routings]
            for d in dry:
                if "max_reserved" in d:
                    d["reserved_vs_card"] = round(d["max_reserved"] / ran["max_reserved"] - 1, 5)
                    d["allocated_vs_card"] = round(d["max_allocated"] / ran["max_allocated"] - 1, 5)
            report["runs"].append({"command": ran["command"], "card": {k: ran[k] for k in (
                "max_reserved", "max_allocated", "tokens_per_expert", "forward_passes", "new_tokens") if k in ran},
                "virtual": dry})
            print(f"values_vs_card: {ran['command']} done", file=sys.stderr)
    emit(report, args.out)


if __name__ == "__main__":
    main()
