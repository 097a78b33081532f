"""Train the shipped DSpark demo: tokenizer, DeepSeek-V4 target, DSpark drafter.

    python -m tools.train_demo {tokenizer,target,drafter,all} --out DIR [--smoke] [--resume]
        [--seed 0] [--threads 2]
    python -m tools.train_demo calibrate --model DIR    (per-position confidence temperatures
        of a trained checkpoint, e.g. dspark_loop/demo, in place)
    python -m tools.train_demo redraft --model DIR --out WORK   (its drafter retrained on
        rollouts sampled at T = 0, 0.7, 1.0; ship with tools.train_demo.redraft_ship)
    python -m tools.train_demo evaluate --model DIR [--model DIR2] --temperatures 0 0.8
        (offline acceptance, greedy and Gumbel-coupled under sampling, held-out rollouts)

Every stage trains through the modules the ranks serve (workers.model: the trunk's paged
prefill with autograd, the drafter's ring/block/Markov pieces), so the served model sees
exactly what it was trained on. Corpus: the Python standard library's own source.
"""
