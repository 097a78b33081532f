"""Train the shipped DSpark demo: tokenizer, DeepSeek-V4 target, DSpark drafter.

    python -m tools.train_demo {tokenizer,target,drafter,all} --out DIR [--smoke] [--resume]
        [--seed 0] [--threads 2]
    python -m tools.train_demo calibrate --model DIR    (per-position confidence temperatures
        of a trained checkpoint, e.g. dspark_loop/demo, in place)

Every stage trains through the modules the ranks serve (workers.model: the trunk's paged
prefill with autograd, the drafter's ring/block/Markov pieces), so the served model sees
exactly what it was trained on. Corpus: the Python standard library's own source.
"""
