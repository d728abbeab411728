"""Which new primary a remote group may follow: lineages of views.

Two members that cannot hear each other may both take over, in one view
number or in successive ones (a partition between backups while the
gateway hears both sides).  A gateway that took one's replies and then
followed the other gave its clients answers the second never knew of:
acknowledged operations lost, and repeated.  So the gateway follows a new
primary only if that primary's view descends from the last view whose
replies it took (its anchor): the new primary lists the views it has been
a member of (its lineage) in NewPrimaryView, and a primary whose lineage
lacks the anchor is refused, and leaves.  A view nobody has taken replies
from yet may still be superseded (the higher of two new primaries wins, as
before any client saw either); once one served, its side alone goes on.

A member's lineage: each (pvn, primary's precedence) it has been in,
newest first, bounded; a member of a view knows the ordering information a
gateway's reflections may still hold of it, which is what a new primary
needs to go on from the gateway's replies."""
from __future__ import annotations

KEEP = 32


class Lineage:
    def __init__(self) -> None:
        self.views: list[tuple[int, int]] = []

    def note(self, pvn: int, precedence: int) -> None:
        key = (pvn, precedence)
        if pvn > 0 and (not self.views or self.views[0] != key):
            self.views.insert(0, key)
            del self.views[KEEP:]

    def of_new_view(self, pvn: int, precedence: int) -> list[list[int]]:
        """What NewPrimaryView lists: the new view, then those before it."""
        return [[pvn, precedence]] + [list(v) for v in self.views if v != (pvn, precedence)]

    def listed(self) -> list[list[int]]:
        return [list(v) for v in self.views]

    def adopt(self, views: list[tuple[int, int]]) -> None:
        """A newcomer's: the primary's that admitted it (its state descends
        from those views; a gateway's anchor may be one before the view it
        joined in, if the primary had not served yet)."""
        self.views = list(views[:KEEP])


def parse_views(raw) -> list[tuple[int, int]]:
    """A listed lineage (none, if malformed)."""
    if not isinstance(raw, list):
        return []
    return [(v[0], v[1]) for v in raw[:KEEP + 1]
            if isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v)]


def parse_lineage(body) -> set[tuple[int, int]]:
    """The views a NewPrimaryView lists (none, if malformed: then it
    descends from nothing a gateway follows)."""
    return set(parse_views(body.get("lineage") if isinstance(body, dict) else None))
