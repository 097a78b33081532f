"""vLLM's and SGLang's spellings of what this server does anyway, so their serve commands run:

    --model-path                                   --model (SGLang)
    --tensor-parallel-size, --tp-size              --tp
    --data-parallel-size, --dp-size                --dp
    --ep-size                                      --ep (SGLang)
    --trust-remote-code                            accepted: no code from a checkpoint is ever run
    --enable-expert-parallel                       accepted: the experts always span every rank
    --enable-auto-tool-choice                      accepted: tool calls are always parsed
    --tool-call-parser, --reasoning-parser NAME    a DeepSeek parser's name (deepseek_v3,
                                                   deepseekv31, deepseek-r1 ...): DeepSeek-V4's
                                                   formats are built in; another name exits 2

The aliases are extra option strings of cli.py's flags (ALIASES); the rest are added here.
"""

from __future__ import annotations

import argparse

ALIASES = {
    "--model": ("--model-path",),
    "--tp": ("--tensor-parallel-size", "--tp-size"),
    "--dp": ("--data-parallel-size", "--dp-size"),
    "--ep": ("--ep-size",),
}


def deepseek_parser(value: str) -> str:
    """A vLLM or SGLang parser name for DeepSeek; this server reads DeepSeek-V4's formats."""
    if not value.lower().replace("-", "").replace("_", "").startswith("deepseek"):
        raise argparse.ArgumentTypeError(
            f"{value!r}: this server parses DeepSeek-V4's own format only (a deepseek parser name, or leave it out)"
        )
    return value


def add_compat_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("vLLM / SGLang spellings (accepted; this server's behaviour either way)")
    a = g.add_argument
    a("--trust-remote-code", action="store_true", help="accepted: no code from a checkpoint is ever run")
    a("--enable-expert-parallel", action="store_true", help="accepted: the routed experts span every rank (--ep)")
    a("--enable-auto-tool-choice", action="store_true", help="accepted: tool calls are always parsed")
    a("--tool-call-parser", type=deepseek_parser, metavar="NAME", help="accepted when a DeepSeek parser's name")
    a("--reasoning-parser", type=deepseek_parser, metavar="NAME", help="accepted when a DeepSeek parser's name")
