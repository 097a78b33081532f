"""The simulated device's flags (--backend sim, workers/sim/), kept apart from cli.py.

    add_sim_flags(parser)        --device-profile, --sim-speed
    sim_fields(parser, ns)       -> ServerConfig fields; a bad value exits 2 naming its flag

The server only checks that the profile exists (a shipped name or a file); every rank loads
it and a bad field fails the start with the rank's message naming the field.
"""

from __future__ import annotations

import argparse
import importlib.util
import os

DEFAULT_PROFILE = "npu-tile"


def profile_dir() -> str:
    """workers/sim/profiles, found without importing the rank package."""
    spec = importlib.util.find_spec("workers")
    roots = list(spec.submodule_search_locations or []) if spec else []
    return os.path.join(roots[0], "sim", "profiles") if roots else ""


def shipped_profiles() -> list[str]:
    d = profile_dir()
    return sorted(f[: -len(".toml")] for f in os.listdir(d) if f.endswith(".toml")) if os.path.isdir(d) else []


def add_sim_flags(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a(
        "--device-profile",
        default=DEFAULT_PROFILE,
        metavar="NAME|FILE",
        help=f"--backend sim: the cost profile a step's time comes from, a shipped one "
        f"({', '.join(shipped_profiles()) or 'none found'}) or a TOML file (default {DEFAULT_PROFILE}; "
        f"docs/simulated-device.md)",
    )
    a(
        "--sim-speed",
        type=float,
        default=1.0,
        metavar="X",
        help="--backend sim: divide every step time by X (X > 1: faster than the device, for tests)",
    )


def sim_fields(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> dict:
    name = ns.device_profile
    is_file = os.sep in name or name.endswith(".toml")
    if is_file and not os.path.isfile(name):
        parser.error(f"argument --device-profile: no such file {name!r}")
    if not is_file and name not in shipped_profiles():
        parser.error(f"argument --device-profile: {name!r} is not a shipped profile ({', '.join(shipped_profiles())})")
    if not ns.sim_speed > 0 or ns.sim_speed == float("inf"):
        parser.error(f"argument --sim-speed: must be a positive number (got {ns.sim_speed})")
    if ns.backend != "sim" and (name != DEFAULT_PROFILE or ns.sim_speed != 1.0):
        parser.error("argument --device-profile/--sim-speed: only with --backend sim")
    return {"device_profile": name, "sim_speed": ns.sim_speed}
