"""Random DeepSeek-V4 checkpoints, written torch-free: the tiny default model the server
builds when the shipped demo is absent (config/default_model.py), and what tests and
`python -m tools.make_checkpoint` write. writer.make_checkpoint is the entry point; the
other modules are its parts (size presets and config.json, tensors and their fill, the
safetensors file, the tokenizer and its corpus, the W8A8 rule). Imports only
dspark_loop.contract of ours."""
