"""The sampling fields' ranges: every out-of-range value is a 400 naming its field."""

import pytest

from dspark_loop.api.chat.schemas import ChatCompletionRequest
from dspark_loop.api.errors import ApiError
from dspark_loop.api.generation.sampling_ranges import NO_LOGPROBS, SamplingDefaults, sampling_fields
from dspark_loop.api.schemas import CompletionRequest
from dspark_loop.contract.sampling_knobs import SamplingKnobs


def req(**fields) -> CompletionRequest:
    return CompletionRequest(prompt="x", **fields)


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], **fields)


BAD = [  # (fields, the param the 400 must name)
    (dict(temperature=-0.1), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.01), "top_p"),
    (dict(top_p=-1), "top_p"),
    (dict(top_k=-2), "top_k"),
    (dict(min_p=-0.1), "min_p"),
    (dict(min_p=1.5), "min_p"),
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(presence_penalty=-2.1), "presence_penalty"),
    (dict(frequency_penalty=3), "frequency_penalty"),
    (dict(repetition_penalty=0), "repetition_penalty"),
    (dict(repetition_penalty=-1), "repetition_penalty"),
    (dict(seed=1 << 64), "seed"),
    (dict(seed=-(1 << 63) - 1), "seed"),
    (dict(n=0), "n"),
    (dict(n=129), "n"),
    (dict(n=2, best_of=3), "best_of"),
    (dict(best_of=0), "best_of"),
    (dict(logprobs=-1), "logprobs"),
    (dict(logprobs=21), "logprobs"),
    (dict(temperature=float("nan")), "temperature"),
]


@pytest.mark.parametrize("fields,param", BAD)
def test_out_of_range_values_answer_400_naming_the_field(fields, param):
    """Each value outside vLLM's range must raise a 400 whose param is the field."""
    with pytest.raises(ApiError) as e:
        sampling_fields(req(**fields), SamplingDefaults())
    assert e.value.status == 400 and e.value.param == param, e.value.message


@pytest.mark.parametrize(
    "fields,param",
    [(dict(logprobs=False, top_logprobs=3), "top_logprobs"), (dict(logprobs=True, top_logprobs=21), "top_logprobs")],
)
def test_chat_top_logprobs_need_logprobs_and_a_small_count(fields, param):
    """Chat's top_logprobs must be in [0, 20] and come with logprobs: true."""
    with pytest.raises(ApiError) as e:
        sampling_fields(chat(**fields), SamplingDefaults())
    assert e.value.param == param


def test_edges_and_neutral_values_are_accepted():
    """The range edges (top_p 1, min_p 0 and 1, penalties +-2, top_k -1) must be accepted;
    top_k -1 means off (0); a seed past 2^63 keeps its 64 bits as a signed value."""
    f = sampling_fields(
        req(
            temperature=0,
            top_p=1,
            top_k=-1,
            min_p=1,
            presence_penalty=-2,
            frequency_penalty=2,
            seed=(1 << 64) - 1,
            n=128,
            best_of=128,
            logprobs=20,
        ),
        SamplingDefaults(),
    )
    assert (f.knobs.temperature, f.knobs.top_k, f.seed, f.n, f.num_logprobs) == (0.0, 0, -1, 128, 20)


def test_absent_fields_take_the_defaults_and_a_missing_seed_is_drawn():
    """Absent fields must take the generation defaults; two requests without a seed must get
    (almost surely) different drawn seeds; logprobs absent means none."""
    d = SamplingDefaults(SamplingKnobs(temperature=0.6, top_p=0.95, top_k=20, min_p=0.01, repetition_penalty=1.1))
    a, b = sampling_fields(req(), d), sampling_fields(req(), d)
    assert a.knobs == SamplingKnobs(temperature=0.6, top_p=0.95, top_k=20, min_p=0.01, repetition_penalty=1.1)
    assert a.seed != b.seed and a.num_logprobs == NO_LOGPROBS
    assert sampling_fields(req(seed=None), SamplingDefaults(seed=7)).seed == 7


def test_chat_logprobs_bool_gives_the_sampled_token_only_or_top_n():
    """Chat logprobs: true alone -> 0 top entries; with top_logprobs N -> N."""
    assert sampling_fields(chat(logprobs=True), SamplingDefaults()).num_logprobs == 0
    assert sampling_fields(chat(logprobs=True, top_logprobs=5), SamplingDefaults()).num_logprobs == 5
    assert sampling_fields(chat(logprobs=False), SamplingDefaults()).num_logprobs == NO_LOGPROBS
