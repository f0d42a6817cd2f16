"""The retry schedule: pure, so it can be property-tested."""

from __future__ import annotations

__all__ = ["compute_backoff_ms"]


def compute_backoff_ms(
    attempt: int, *, base_ms: int, max_ms: int, jitter: float = 0.0, random_unit: float = 0.5
) -> int:
    """Delay before retry ``attempt`` (1-based): ``base_ms`` doubling per attempt, capped at
    ``max_ms``, then spread by ±``jitter`` (a fraction) using ``random_unit`` in [0, 1)."""
    if attempt < 1:
        return 0
    delay = min(max_ms, base_ms * 2 ** min(attempt - 1, 62))
    spread = delay * jitter * (2 * random_unit - 1)
    return max(0, int(delay + spread))
