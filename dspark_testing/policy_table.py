"""The policy simulator's comparison table: ours against every static choice and the vLLM rule.

    python -m dspark_testing.policy_table [--steps 800] [--analytic] [--profiles P ...]
                                          [--streams 1 16 64 256] [--temperatures 0 0.8]

Per profile x concurrency x temperature: ours (cold: no start-up profile) in tokens per
simulated second over the decode steps after the first quarter, its ratio to the best
static choice (K=0 = w0, windows w1..w6, the fixed chain w7) and to the vLLM rule (a
start-up table), to K=0 and to the chain, and `cold`: its rate over decode steps 200-500
over its rate from 500 on (>= 0.98: within 2% of steady after 200 steps; with --steps >=
800). Default: the simulated device's profiles (policy_device.DEVICE_PROFILES: workers/sim's
cost model and acceptance); --analytic: the analytic cost shapes of policy_sim.PROFILES.
"""

from __future__ import annotations

import argparse

from dspark_testing.policy_device import DEVICE_PROFILES
from dspark_testing.policy_sim import PROFILES, Scenario, policies, simulate


def cell(sc: Scenario) -> dict:
    lo = sc.steps // 4
    rates, cold = {}, float("nan")
    for name, make in policies(sc).items():
        run = simulate(make(), sc)
        rates[name] = run.rate(lo)
        if name == "ours" and sc.steps >= 800:
            cold = run.rate(200, 500) / run.rate(500)
    statics = {k: v for k, v in rates.items() if k.startswith("w")}
    best = max(statics, key=statics.__getitem__)
    ours = rates["ours"]
    return {
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
    args = ap.parse_args(argv)
    profiles = args.profiles or list(PROFILES if args.analytic else DEVICE_PROFILES)
    print("profile      streams  T   |   ours tok/s  best  ours/best  ours/vllm  ours/K0  ours/w7  cold")
    for profile in profiles:
        for c in args.streams:
            for t in args.temperatures:
                r = cell(Scenario(profile, c, t, args.steps, device=not args.analytic))
                print(
                    f"{profile:12s} {c:6d}  {t:.1f}  | {r['ours_tok_s']:11,.0f}  {r['best_static']:>4s}  "
                    f"{r['vs_best']:9.3f}  {r['vs_vllm']:9.3f}  {r['vs_k0']:7.3f}  {r['vs_w7']:7.3f}  {r['cold']:.3f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
