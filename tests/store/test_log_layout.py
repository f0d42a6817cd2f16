"""``Layout``: the vectorised ``keys_for`` (the offline import's call) and ``keys_at`` (cleanup's)
give the scalar ``key_for`` (the write path's) and ``key`` for every due time, at each level's
edges too."""

from __future__ import annotations

import numpy as np

from tarry.store.log.layout import MAX_LEVEL, PER_LEVEL, Layout

NOW = 1_700_000_000_123


def test_keys_for_agrees_with_key_for_at_random_and_at_every_edge() -> None:
    for granularity in (60_000, 300_000):
        layout = Layout(granularity)
        rng = np.random.default_rng(granularity)
        ahead = list(rng.integers(-86_400_000, 400 * 86_400_000, 20_000))
        for level in range(MAX_LEVEL + 1):
            width = granularity * 4**level
            reach = PER_LEVEL * width
            ahead += [reach - 1, reach, reach + 1, width - 1, width, -width]
            # window edges: the first and last millisecond of a partition of this level
            start = (NOW + reach) // width * width
            ahead += [start - NOW, start - NOW - 1, start + width - 1 - NOW]
        dues = NOW + np.array(ahead, np.int64)
        keys = layout.keys_for(dues, NOW)
        assert keys.tolist() == [layout.key_for(int(d), NOW) for d in dues]
        for level in range(MAX_LEVEL + 1):  # and each level's key, as cleanup files keys by
            assert layout.keys_at(dues, level).tolist() == [layout.key(int(d), level) for d in dues]
        # and each key's window holds its due time, in a directory that names the key
        for due, key in zip(dues.tolist()[::97], keys.tolist()[::97], strict=True):
            start, end = layout.window(key)
            assert start <= due < end
            assert Layout.parse_name(Layout.name_of(key)) == key
