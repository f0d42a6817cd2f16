"""The import's closing summary: what was read, accepted, refused (by code), repeated, written."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["ImportSummary"]


@dataclass(slots=True)
class ImportSummary:
    rows_read: int = 0
    #: Rows that passed every rule and were not repeats: the messages imported.
    accepted: int = 0
    #: Rows refused by a rule (and, online, by the server after the last retry), by error code.
    rejected: dict[str, int] = field(default_factory=dict)
    #: Repeats of an earlier row's (destination, message_id).
    duplicates: int = 0
    #: Stored copies: one per message to a queue, one per subscription for a topic.
    copies: int = 0
    #: Distinct time partitions the accepted copies fall into.
    partitions: int = 0
    #: Online sink: messages the server stored now / already held from an earlier run.
    created: int = 0
    already_there: int = 0
    #: Offline sink: segment files written, and the import area the store adopts at start.
    files: int = 0
    import_area: str | None = None
    seconds: float = 0.0
    rejects_dir: str | None = None
    ignored_columns: list[str] = field(default_factory=list)
    #: Seconds per phase (catalog, validating, sending, counting, plan, rejects).
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def rows_per_s(self) -> float:
        return self.rows_read / self.seconds if self.seconds > 0 else 0.0

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["rows_per_s"] = round(self.rows_per_s, 1)
        data["seconds"] = round(self.seconds, 3)
        return data

    def lines(self) -> list[tuple[str, str]]:
        """(label, value) pairs for a table."""
        rows = [
            ("rows read", f"{self.rows_read:,}"),
            ("accepted", f"{self.accepted:,}"),
            ("rejected", f"{self.rejected_total:,}"),
        ]
        rows += [(f"  {code}", f"{n:,}") for code, n in sorted(self.rejected.items())]
        rows += [
            ("duplicates", f"{self.duplicates:,}"),
            ("copies (after topic fan-out)", f"{self.copies:,}"),
            ("time partitions", f"{self.partitions:,}"),
        ]
        if self.created or self.already_there:
            rows += [
                ("stored by the server", f"{self.created:,}"),
                ("already there (rerun)", f"{self.already_there:,}"),
            ]
        if self.import_area:
            rows += [
                ("segment files", f"{self.files:,}"),
                ("import area (adopted at start)", self.import_area),
            ]
        rows += [
            ("seconds", f"{self.seconds:.1f}"),
            ("rows/s", f"{self.rows_per_s:,.0f}"),
            ("rejects", self.rejects_dir or "-"),
        ]
        if self.ignored_columns:
            rows.append(("ignored input columns", ", ".join(self.ignored_columns)))
        return rows
