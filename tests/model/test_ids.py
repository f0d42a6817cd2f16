"""Message ids: the due time an id carries, read one by one (``id_due_ms``) and in arrays
(``ids_due_ms``, what cleanup reads a deleted partition's keys with) alike."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tarry.model.ids import IdGenerator, id_due_ms, ids_due_ms

NOW = 1_700_000_000_000
ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def one_by_one(ids: list[str]) -> list[int]:
    return [-1 if (due := id_due_ms(i)) is None else due for i in ids]


def test_ids_made_for_a_due_time_give_it_back_in_arrays() -> None:
    # Given ids made for due times from 0 to the largest an id holds
    ids = IdGenerator()
    dues = [0, 1, NOW, NOW + 5, (1 << 42) - 1]
    made = [ids.new_due(NOW, due) for due in dues]
    # When they are read in one array
    # Then each gives its due time, as one by one
    assert ids_due_ms(made).tolist() == dues == one_by_one(made)


def test_text_that_carries_no_due_time_gives_minus_one() -> None:
    # Given an id made without a due time, and text that is no id of tarry's
    others = [
        IdGenerator().new(NOW),
        "",
        "short",
        "0" * 26,
        "z" * 26,  # lower case is outside the alphabet
        "7" + "Z" * 27,  # too long
        "é" * 26,  # not ASCII
        "Z" * 25 + "!",
    ]
    # When they are read in one array
    # Then each is -1, as one by one (None)
    assert ids_due_ms(others).tolist() == [-1] * len(others) == one_by_one(others)


@given(st.lists(st.text(alphabet=ALPHABET + "az!é", min_size=24, max_size=28), max_size=40))
def test_any_text_reads_the_same_in_arrays_as_one_by_one(texts: list[str]) -> None:
    assert ids_due_ms(texts).tolist() == one_by_one(texts)


@given(st.lists(st.integers(min_value=0, max_value=(1 << 42) - 1), max_size=40))
def test_any_due_time_reads_back_from_its_id(dues: list[int]) -> None:
    made = [IdGenerator().new_due(NOW, due) for due in dues]
    assert ids_due_ms(made).tolist() == dues
