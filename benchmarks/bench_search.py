"""How many runs `fit --search` takes on made-up memory curves; prints JSON.

    python benchmarks/bench_search.py [--cases 20000] [--out FILE]

No command runs: each "run" answers from a curve as fit's would (the headroom
where it fits; where it runs out, a shortfall that is the deficit or, as a
post-mortem's often is, a half or a quarter of it). Three families:
  linear    memory = base + per_unit * value, the range and boundary random
  replayed  a smaller card of the same chip searched after a larger one: the
            larger card's runs, answered with the smaller memory, foreseen
  monotone  piecewise curves of generated steps and slopes (flat stretches,
            jumps; the boundary anywhere)
For each: the runs' histogram and mean, and how many searches took more than
bisection's ceil(log2(HIGH - LOW + 2)) runs plus one.
"""

from __future__ import annotations

import argparse
import math
import random

from allocscope.harness.search import search_largest
from _common import emit


def memory(need, budget, lower_bound=1):
    def run(v):
        n = need(v)
        if n <= budget:
            return {"verdict": "fits", "exit_status": 0, "headroom_bytes": budget - n}
        return {"verdict": "out of memory", "exit_status": 1, "shortfall_bytes": max(1, (n - budget) // lower_bound)}
    return run


def summary(runs: list[int], over: int) -> dict:
    hist: dict[int, int] = {}
    for r in runs:
        hist[r] = hist.get(r, 0) + 1
    return {"searches": len(runs), "mean_runs": round(sum(runs) / len(runs), 3), "max_runs": max(runs),
            "histogram": dict(sorted(hist.items())), "over_bisection_plus_one": over}


def linear(cases: int, rng: random.Random) -> dict:
    runs, over = [], 0
    for _ in range(cases):
        base, per = rng.randint(0, 10**9), rng.randint(1, 10**7)
        budget, low, span = rng.randint(0, 2 * 10**10), rng.randint(1, 64), rng.randint(0, 4096)
        out = search_largest(low, low + span, memory(lambda v, base=base, per=per: base + per * v, budget,
                                                     rng.choice([1, 1, 2, 4])))
        runs.append(out["runs"])
        over += out["runs"] > math.ceil(math.log2(span + 2)) + 1
    return summary(runs, over)


def replayed(cases: int, rng: random.Random) -> dict:
    runs, over = [], 0
    for _ in range(cases):
        base, per = rng.randint(0, 2 * 10**9), rng.randint(10**8, 2 * 10**9)
        big, small = 80 * 10**9, 40 * 10**9

        def need(v, base=base, per=per):
            return base + per * v

        larger = search_largest(20, 70, memory(need, big))
        known = {}
        for v in larger["tried"]:
            n = need(v)
            known[v] = ({"verdict": "fits", "headroom_bytes": small - n} if n <= small
                        else {"verdict": "out of memory", "shortfall_bytes": n - small})
        out = search_largest(20, 70, memory(need, small), known)
        runs.append(out["runs"])
        over += out["runs"] > math.ceil(math.log2(53)) + 1
    return summary(runs, over)


def monotone(cases: int, rng: random.Random) -> dict:
    runs, over = [], 0
    for _ in range(cases):
        span = rng.choice([0, 1, 2, 3, 10, 100, 1000, 10**5, 4 * 10**6])
        incs = [rng.choice([0, rng.randint(0, 10**6), rng.randint(0, 10**9)]) for _ in range(rng.randint(1, 30))]

        def need(v, incs=incs, span=span):
            x = (v - 1) * len(incs) / (span + 1)
            i = min(int(x), len(incs) - 1)
            return sum(incs[:i]) + int(incs[i] * (x - i)) + v

        budget = need(1 + int(rng.random() * span)) + rng.choice([0, 0, 1, 10**3])
        out = search_largest(1, 1 + span, memory(need, budget, rng.randint(1, 8)))
        runs.append(out["runs"])
        over += out["runs"] > math.ceil(math.log2(span + 2)) + 1
    return summary(runs, over)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    emit({"benchmark": "search", "cases": args.cases, "seed": args.seed, "linear": linear(args.cases, rng),
          "replayed": replayed(args.cases // 5, rng), "monotone": monotone(args.cases, rng)}, args.out)


if __name__ == "__main__":
    main()
