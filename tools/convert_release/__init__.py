"""DeepSeek release checkpoint (FP8 + FP4) -> W8A8 or bf16; `python -m tools.convert_release`.

fp8 / fp4: the codecs; names: the release's names and precisions; layout: the tensors
config.json implies; shard_reader / shard_writer: safetensors without torch; plan: header
validation into per-tensor jobs; transcode: one tensor band by band; marker: resume state
and the source hash; convert: the run; __main__: the CLI.
"""
