"""dualtrain.random: keyed Philox streams whose draws are part of what users reproduce.

The literal values below were drawn by the code before `dualtrain.random` existed
(``fuel.streams.stream`` and ``craft.params.initial_value``'s own key): any change to a key,
a counter or a draw method fails here.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from dualtrain import random
from dualtrain.craft.params import ParamSpec, initial_value
from dualtrain.embeddings.init import fill
from dualtrain.errors import ArgumentError
from dualtrain.fuel import streams


def test_order_draws_are_pinned():
    assert random.stream(7, "order", 3).permutation(10).tolist() == [0, 1, 7, 6, 2, 4, 3, 9, 8, 5]


def test_augment_draws_are_pinned():
    assert random.stream(7, "augment", 1, 42, 0).random(3).tolist() == [
        0.8266099431225135,
        0.3478559021027451,
        0.843610713587702,
    ]


def test_fill_draws_are_pinned():  # a seed past 2**64 is taken modulo 2**64
    assert random.stream(2**64 + 5, "fill", 0, 1).integers(0, 1000, 4).tolist() == [
        908,
        895,
        361,
        999,
    ]


def test_rows_draws_are_pinned():
    assert random.stream(11, "rows", 2).standard_normal(3).tolist() == [
        1.4276448090073295,
        2.5090823541687413,
        -0.6995403685335689,
    ]
    table = np.zeros((4100, 2))
    fill(table, "normal", 1.0, 3)  # two blocks: rows 0 and 4097 come from two streams
    assert table[0].tolist() == [1.7902358171912516, 2.2263057832339608]
    assert table[4097].tolist() == [1.1961774304044528, 0.24340265243070536]


def test_init_draws_are_pinned():
    normal = ParamSpec((3,), "normal", 0.5)
    uniform = ParamSpec((3,), "uniform", 1.0)
    assert initial_value(normal, "fc1.weight", 5, np.float64).tolist() == [
        0.5020351157770401,
        0.36298238891405366,
        0.8879499671182112,
    ]
    assert initial_value(uniform, "block.0.bias", 2**40, np.float64).tolist() == [
        0.44959626535436836,
        -0.4317928906773709,
        -0.7705302543357344,
    ]
    assert random.stream(5, "init", "fc1.weight").normal(0.0, 0.5, 3).tolist() == (
        initial_value(normal, "fc1.weight", 5, np.float64).tolist()
    )


def test_fuels_names_are_the_same_streams():
    assert streams.stream is random.stream
    for code, word in [(streams.ORDER, "order"), (streams.AUGMENT, "augment")]:
        a = random.stream(3, code, 1, 2).random(4)
        np.testing.assert_array_equal(a, random.stream(3, word, 1, 2).random(4))
    assert (streams.FILL, streams.EMBED) == (3, 4)


@given(
    seed=st.integers(0, 2**64 - 1),
    purpose=st.sampled_from(["order", "augment", "fill", "rows"]),
    words=st.lists(st.integers(0, 2**32), max_size=3),
)
def test_a_stream_is_a_function_of_its_key_alone(seed, purpose, words):
    a = random.stream(seed, purpose, *words).integers(0, 2**63, 4)
    b = random.stream(seed, purpose, *map(np.int64, words)).integers(0, 2**63, 4)
    np.testing.assert_array_equal(a, b)
    other = "order" if purpose != "order" else "rows"
    assert not np.array_equal(a, random.stream(seed, other, *words).integers(0, 2**63, 4))


@pytest.mark.parametrize(
    ("purpose", "words"),
    [
        ("shuffle", (1,)),
        (True, (1,)),
        ("order", (1, 2, 3, 4)),
        ("order", (-1,)),
        ("order", ("a",)),
        ("init", ()),
        ("init", (3,)),
    ],
)
def test_bad_purposes_and_words_are_refused_by_name(purpose, words):
    with pytest.raises(ArgumentError, match=r"purpose|words"):
        random.stream(1, purpose, *words)


def test_an_init_seed_out_of_range_is_refused():
    with pytest.raises(ArgumentError, match="seed"):
        random.stream(2**64, "init", "w")
    with pytest.raises(ArgumentError, match="seed"):
        random.stream(-1, "init", "w")


@given(
    purpose=st.sampled_from(["order", "augment", "fill", "rows"]),
    word=st.integers(2**63, 2**80),
    position=st.integers(0, 2),
)
def test_a_counter_word_numpy_would_fold_onto_another_is_refused(purpose, word, position):
    """Philox folds words in [2**63, 2**64) onto others (two epochs, one stream) and raises a
    raw OverflowError past 2**64: both are refused by name before a stream is made."""
    words = [0, 0, 0]
    words[position] = word
    with pytest.raises(ArgumentError, match=r"words.*2\*\*63"):
        random.stream(1, purpose, *words)
