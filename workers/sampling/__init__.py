"""Rank-side sampling: counter-based Gumbel noise, vLLM's logit processors with global
thresholds over vocab slices, and raw-logit logprobs. See sampler.py for the entry point."""
