"""The simulator's split of what an order has left into shipments: never more, never less."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from warehouse_simulator.shipping import split

LEFT = st.dictionaries(
    st.text("ABCDEFGH", min_size=1, max_size=3), st.integers(1, 1_000_000), min_size=1, max_size=8
)


@given(left=LEFT, parts=st.integers(1, 10), seed=st.integers(0, 2**32))
def test_the_parcels_add_up_to_what_is_left_and_none_is_empty(
    left: dict[str, int], parts: int, seed: int
) -> None:
    parcels = split(left, parts, random.Random(seed))

    total = Counter[str]()
    for parcel in parcels:
        assert parcel
        assert all(quantity > 0 for quantity in parcel.values())
        total.update(parcel)
    assert total == Counter(left)
    assert len(parcels) == min(parts, sum(left.values()))


def test_one_unit_is_one_parcel_however_many_are_asked() -> None:
    assert split({"85123A": 1}, 5, random.Random(1)) == [{"85123A": 1}]
