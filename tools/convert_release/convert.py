"""The conversion, shard by shard: plan (headers only), then for each source shard one
output shard of the same name, then the index, tokenizer, generation config, config.json
and the completed marker.

    SRC/model-0000k-of-0000N.safetensors --(FP8/FP4 -> fp32 -> bf16 | W8A8)--> OUT/same name
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import time
from dataclasses import dataclass

from dspark_loop.checkpoint import w8a8 as w8a8_rules
from tools.convert_release.errors import ReleaseError
from tools.convert_release.marker import Marker, partial_path, source_hash
from tools.convert_release.plan import Plan, TensorJob, build_plan
from tools.convert_release.shard_writer import ShardWriter
from tools.convert_release.transcode import convert_tensor

SIDE_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "LICENSE",
)
REQUIRED_SIDE_FILES = ("tokenizer.json",)
INDEX_FILE = "model.safetensors.index.json"


@dataclass
class Summary:
    num_shards: int
    num_converted: int  # shards written by this run (the rest were done before --resume)
    num_tensors: int
    bytes_in: int  # source bytes of the shards this run converted
    bytes_out: int
    seconds: float
    peak_rss_mb: float

    @property
    def mb_per_s(self) -> float:
        return self.bytes_in / 2**20 / max(self.seconds, 1e-9)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def output_config(config: dict, fmt: str) -> dict:
    out = {k: v for k, v in config.items() if k != "quantization_config"}
    out["dtype"] = "bfloat16"
    if "torch_dtype" in out:
        out["torch_dtype"] = "bfloat16"
    if fmt == "w8a8":
        out["checkpoint_format"] = w8a8_rules.FORMAT
    return out


def _write_json(path: str, obj: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def _convert_shard(plan: Plan, file_name: str, jobs: list[TensorJob], out_dir: str, quiet: bool) -> int:
    from tqdm import tqdm

    partial = partial_path(out_dir, file_name)
    writer = ShardWriter(partial, [o for job in jobs for o in job.outputs()])
    bar = tqdm(
        total=sum(j.source_bytes for j in jobs), unit="B", unit_scale=True, desc=file_name, disable=quiet, leave=False
    )
    try:
        for job in jobs:
            convert_tensor(job, plan.shards, writer, plan.block, bar.update)
        writer.close()
    except BaseException:
        writer.abort()
        os.remove(partial)
        raise
    finally:
        bar.close()
    os.replace(partial, os.path.join(out_dir, file_name))
    return writer.total_bytes


def _finish(plan: Plan, out_dir: str) -> None:
    weight_map, total = {}, 0
    for file_name, jobs in plan.jobs.items():
        for job in jobs:
            for name, _, _ in job.outputs():
                weight_map[name] = file_name
    for file_name in plan.jobs:
        total += os.path.getsize(os.path.join(out_dir, file_name))
    _write_json(
        os.path.join(out_dir, INDEX_FILE),
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
    )
    for name in SIDE_FILES:
        if os.path.isfile(os.path.join(plan.src_dir, name)):
            shutil.copyfile(os.path.join(plan.src_dir, name), os.path.join(out_dir, name))
    if plan.fmt == "w8a8":
        with open(os.path.join(out_dir, w8a8_rules.MARKER_FILE), "w", encoding="utf-8") as f:
            f.write(f"{w8a8_rules.FORMAT}\nscale_name=scale\n")
    _write_json(os.path.join(out_dir, "config.json"), output_config(plan.config, plan.fmt))


def describe(plan: Plan) -> str:
    kinds: dict[str, int] = {}
    for jobs in plan.jobs.values():
        for job in jobs:
            kinds[job.kind] = kinds.get(job.kind, 0) + 1
    num_q = sum(j.quantize for jobs in plan.jobs.values() for j in jobs)
    src_mb = sum(s.size for s in plan.shards.values()) / 2**20
    drafter = f"DSpark drafter {plan.cfg.dspark.num_stages} stages" if plan.cfg.dspark else "no drafter"
    return (
        f"{len(plan.shards)} shards, {src_mb:.1f} MiB; tensors: "
        + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
        + f"; {num_q} to W8A8; {drafter}; FP8 block {plan.block[0]}x{plan.block[1]}"
        + (f"; {len(plan.unchecked)} mtp.* tensors carried without a shape check" if plan.unchecked else "")
    )


def convert(
    src_dir: str,
    out_dir: str,
    fmt: str = "w8a8",
    resume: bool = False,
    dry_run: bool = False,
    quiet: bool = False,
    log=print,
) -> Summary | None:
    src_dir, out_dir = os.path.abspath(src_dir), os.path.abspath(out_dir)
    if os.path.realpath(src_dir) == os.path.realpath(out_dir):
        raise ReleaseError("OUT must differ from SRC")
    plan = build_plan(src_dir, fmt)
    try:
        for name in REQUIRED_SIDE_FILES:
            if not os.path.isfile(os.path.join(src_dir, name)):
                raise ReleaseError(f"SRC {src_dir} has no {name}")
        log(f"plan: {describe(plan)}")
        if dry_run:
            return None
        t0 = time.perf_counter()
        marker = Marker.start(
            out_dir, fmt, source_hash(os.path.join(src_dir, "config.json"), plan.shards), plan.block, resume
        )
        converted = bytes_in = bytes_out = 0
        for file_name in sorted(plan.jobs):
            if marker.is_done(file_name):
                continue
            jobs = plan.jobs[file_name]
            size = _convert_shard(plan, file_name, jobs, out_dir, quiet)
            marker.record_shard(file_name, size, sum(len(j.outputs()) for j in jobs))
            converted += 1
            bytes_in += plan.shards[file_name].size
            bytes_out += size
        if not marker.state["complete"]:
            _finish(plan, out_dir)
            marker.finish()
        summary = Summary(
            len(plan.jobs),
            converted,
            sum(len(j) for j in plan.jobs.values()),
            bytes_in,
            bytes_out,
            time.perf_counter() - t0,
            peak_rss_mb(),
        )
        log(
            f"converted {summary.num_converted}/{summary.num_shards} shards "
            f"({summary.bytes_in / 2**20:.1f} MiB -> {summary.bytes_out / 2**20:.1f} MiB) in "
            f"{summary.seconds:.2f} s, {summary.mb_per_s:.1f} MiB/s, peak RSS {summary.peak_rss_mb:.0f} MiB"
        )
        return summary
    finally:
        plan.close()
