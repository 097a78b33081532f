"""The policy simulator's comparison table: ours against every static choice and the vLLM rule.

    python -m dspark_testing.policy_table [--steps 800] [--analytic] [--profiles P ...]
                                          [--streams 1 16 64 256] [--temperatures 0 0.8]
                                          [--cache FILE | --no-cache]

Per profile x concurrency x temperature: ours (cold: no start-up profile) in tokens per
simulated second over the decode steps after the first quarter, its ratio to the best
static choice (K=0 = w0, windows w1..w6, the fixed chain w7) and to the vLLM rule (a
start-up table), to K=0 and to the chain, and `cold`: its rate over decode steps 200-500
over its rate from 500 on (>= 0.98: within 2% of steady after 200 steps; with --steps >=
800). Default: the simulated device's profiles (policy_device.DEVICE_PROFILES: workers/sim's
cost model and acceptance); --analytic: the analytic cost shapes of policy_sim.PROFILES.

Every run is simulated time, so a policy's figures in a cell are a pure function of the
code: each is kept in the cache (default .dspark-cache/policy_table.json) under a hash of
the sources it depends on, so an interrupted matrix resumes where it stopped, and after a
change of the rule only ours and the vLLM rule run again (the static choices do not read
the rule's files).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import inspect
import json
import os
from pathlib import Path

from dspark_loop.engine.verify.adaptive import solve
from dspark_loop.engine.verify.tunables import DEFAULT
from dspark_testing.policy_device import DEVICE_PROFILES
from dspark_testing.policy_sim import PROFILES, Scenario, policies, simulate

ROOT = Path(__file__).resolve().parent.parent
# what every policy's run reads: the scheduler, the wire, the simulator, the sim's profiles
# and the model shapes its cost model prices
HARNESS = ["dspark_loop/engine", "dspark_loop/contract", "dspark_loop/checkpoint", "dspark_testing", "workers/sim"]
SHAPES = ["dspark_loop/demo/config.json"]
# what only the learning policies read (the static choices run the scheduler, never these)
RULE = ["adaptive.py", "budget.py", "calibration.py", "cost_table.py", "feedback.py", "tunables.py"]


def source_hashes() -> dict[str, str]:
    """{"static": hash of the harness without the rule's files, "ours": with them, "served":
    and the start-up profile's, "vllm":
    with what the vLLM rule reads of them (the solver, the cost table and its tunables)}."""
    files = sorted(p for d in HARNESS for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".toml"))
    files += [ROOT / f for f in SHAPES]
    rule = [p for p in files if p.parent.name == "verify" and p.name in RULE]
    rule.append(ROOT / "dspark_testing" / "vllm_rule.py")

    def digest(paths) -> str:
        h = hashlib.sha256()
        for p in paths:
            h.update(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes())
        return h.hexdigest()[:16]

    static = digest(p for p in files if p not in rule and p.name != "policy_table.py")
    reads = [p for p in rule if p.name in ("budget.py", "cost_table.py", "vllm_rule.py")]
    t = DEFAULT
    read = f"{inspect.getsource(solve)}{(t.cell_samples, t.min_samples, t.horizon, t.shift)}"
    vllm = static + digest(reads) + hashlib.sha256(read.encode()).hexdigest()[:16]
    served = static + digest(rule) + digest([ROOT / "dspark_loop/engine/profile_plan.py"])
    return {"static": static, "ours": static + digest(rule), "served": served, "vllm": vllm}


class Cache:
    """Per-run figures by (scenario, policy, source hash), kept in a JSON file."""

    def __init__(self, path: str | None):
        self.path = path
        self.data: dict = {}
        if path and os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                self.data = json.load(f)
        self.hashes = source_hashes()

    def key(self, sc: Scenario, name: str) -> str:
        code = self.hashes["static" if name.startswith("w") else "vllm" if name == "vllm" else name]
        host = "" if not any(sc.host_s) else f"/host{sc.host_s[0]:g},{sc.host_s[1]:g}"
        return (
            f"{sc.profile}/{sc.concurrency}/{sc.temperature}/{sc.steps}/{int(sc.device)}/{sc.seed}{host}/{name}/{code}"
        )

    def get(self, sc: Scenario, name: str) -> dict | None:
        return self.data.get(self.key(sc, name))

    def put(self, sc: Scenario, name: str, figures: dict) -> None:
        self.data[self.key(sc, name)] = figures
        if self.path:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            with open(self.path + ".tmp", "w", encoding="utf-8") as f:
                json.dump(self.data, f, indent=0, sort_keys=True)
            os.replace(self.path + ".tmp", self.path)


WINDOWS = {"judged": (None, None), "early": (200, 500), "late": (500, None)}  # decode steps (judged: lo = steps / 4)


def run_figures(make, sc: Scenario) -> dict:
    """A policy's tokens and simulated seconds over the judged steps (after the first
    quarter) and, for the cold-start ratio, over steps 200-500 and from 500 on."""
    run = simulate(make(), sc)
    out = {}
    for w, (lo, hi) in WINDOWS.items():
        lo = sc.steps // 4 if lo is None else lo
        out[w] = [float(sum(run.tokens[lo:hi])), float(sum(run.seconds[lo:hi]))]
    return out


def cell(sc: Scenario, cache: Cache | None = None, seeds: int = 1) -> dict:
    """Ours against the others in one cell, each policy's tokens and seconds summed over the
    workload draws 0..seeds-1."""
    cache = cache or Cache(None)
    rates, cold = {}, float("nan")
    for name, make in policies(sc).items():
        sums = {w: [0.0, 0.0] for w in WINDOWS}
        for seed in range(seeds):
            one = dataclasses.replace(sc, seed=seed)
            figures = cache.get(one, name)
            if figures is None:
                figures = run_figures(make, one)
                cache.put(one, name, figures)
            for w in WINDOWS:
                sums[w] = [a + b for a, b in zip(sums[w], figures[w], strict=True)]
        rates[name] = sums["judged"][0] / sums["judged"][1]
        if name == "ours" and sc.steps >= 800:
            cold = (sums["early"][0] / sums["early"][1]) / (sums["late"][0] / sums["late"][1])
    statics = {k: v for k, v in rates.items() if k.startswith("w")}
    best = max(statics, key=statics.__getitem__)
    ours = rates["ours"]
    return {
        "served_vs_best": rates["served"] / statics[best],
        "served_vs_vllm": rates["served"] / rates["vllm"],
        "ours_tok_s": ours,
        "best_static": best,
        "vs_best": ours / statics[best],
        "vs_vllm": ours / rates["vllm"],
        "vs_k0": ours / rates["w0"],
        "vs_w7": ours / rates["w7"],
        "cold": cold,
        "rates": rates,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m dspark_testing.policy_table", description=__doc__)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--analytic", action="store_true", help="the analytic cost shapes, not the simulated device")
    ap.add_argument("--profiles", nargs="+", default=None)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.8])
    ap.add_argument("--cache", default=str(ROOT / ".dspark-cache" / "policy_table.json"))
    ap.add_argument("--no-cache", action="store_true", help="run every policy again")
    ap.add_argument("--rates", action="store_true", help="also print every policy's tok/s")
    ap.add_argument("--seeds", type=int, default=1, help="workload draws per cell (tokens and seconds summed)")
    ap.add_argument(
        "--host-s",
        type=float,
        nargs=2,
        default=(0.0, 0.0),
        metavar=("FIXED", "PER_STREAM"),
        help="a host stage beside the device, seconds per step (as with async scheduling; default none)",
    )
    args = ap.parse_args(argv)
    cache = Cache(None if args.no_cache else args.cache)
    profiles = args.profiles or list(PROFILES if args.analytic else DEVICE_PROFILES)
    print(
        "profile      streams  T   |   ours tok/s  best  ours/best  ours/vllm  ours/K0  ours/w7  cold"
        "  |  served/best  served/vllm"
    )
    for profile in profiles:
        for c in args.streams:
            for t in args.temperatures:
                sc = Scenario(profile, c, t, args.steps, device=not args.analytic, host_s=tuple(args.host_s))
                r = cell(sc, cache, args.seeds)
                print(
                    f"{profile:12s} {c:6d}  {t:.1f}  | {r['ours_tok_s']:11,.0f}  {r['best_static']:>4s}  "
                    f"{r['vs_best']:9.3f}  {r['vs_vllm']:9.3f}  {r['vs_k0']:7.3f}  {r['vs_w7']:7.3f}  {r['cold']:.3f}"
                    f"  |  {r['served_vs_best']:11.3f}  {r['served_vs_vllm']:11.3f}",
                    flush=True,
                )
                if args.rates:
                    print("    " + "  ".join(f"{k} {v:,.0f}" for k, v in r["rates"].items()), flush=True)


if __name__ == "__main__":
    main()
