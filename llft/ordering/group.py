"""The seam between the replication core across hosts and an ordering
backend: what a member's core (llft/cluster/member.py) and a gateway
(llft/cluster/gateway.py) ask of the group communication beneath them.
The core decides what replicas do; a backend carries, orders, and keeps
the membership.

    core                                   backend (llft/ordering/<name>/)
    connect/send/writable/finish, recv --> Connections: one connection per
                                           client connection, in order
    order(blob), on_order(oseq, blob)  --> the primary's ordering information,
                                           released to backups in its order
    membership.tick(), hooks           <-- views, elections, removals, the cut
                                           (take_over) at which a view ends
    joiner_state / checkpoint hooks    <-- a newcomer's admission and its state

Everything here is abstract: a backend's package subclasses it, and only
`member_backend` and `open_gateway` name the packages."""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from llft.ordering.ids import ConnId, View

ORDERS_ACROSS_HOSTS = ("llft",)


class Excluded(Exception):
    """This member must leave the group (why)."""


class JoinRefused(Exception):
    """The group did not take this member in (why)."""


class CheckpointRefused(Exception):
    """No checkpoint can be taken for a newcomer now (why)."""


class SourceRefused(Exception):
    """The backup asked for a newcomer's checkpoint gives none (why); the
    primary takes its own."""


@dataclass
class Joined:
    """What a newcomer gets on joining: its view, its replica's index, the
    ordering position it starts after, the history or the checkpoint that
    brings it there, and per connection what it takes over."""
    view: View
    index: int
    oseq: int
    history: list                # [[oseq, blob]] to apply, in order
    conns: list                  # [[client, server, seq, consumed, acked, logged_from, [request]]]
    settling_s: float = 0.0      # the primary's takeover was this recent
    lineage: list = field(default_factory=list)   # the backend's record of the primary's views
    checkpoint: dict | None = None   # a checkpoint's cut, instead of the history (checkpoint_join.py)
    seen: list = field(default_factory=list)   # others' admissions seen meanwhile: followed once in


@dataclass
class MemberHooks:
    """What the membership asks of a member's replication core."""
    view_changed: Callable[[], None]                  # the view changed (llft-status shows it)
    leave: Callable[[str], None]                      # this member must leave the group: why
    held_after: Callable[..., tuple[int, list[bytes]]]   # (oseq, upto=None): released entries after oseq
    elected: Callable[[View, dict], None]             # phase 1 won: the core takes over
    heard: Callable[[], None]                         # a membership message arrived
    joiner_state: Callable[[], dict]                  # what a newcomer needs, by log
    why_no_joining: Callable[[], str | None]          # why no newcomer can be admitted now
    checkpoint_for: Callable[[int, bool], bool]       # (member, restores): admitted by checkpoint
    checkpoint_here: Callable[[int], Awaitable[object]]   # (member): a backup's checkpoint for it, to offer


class Connections(abc.ABC):
    """A group's end of its connections with other groups: a gateway's, or
    a member's.  Messages of a connection arrive in order and once; the
    callbacks run on the event loop."""
    on_deliver: Callable[[ConnId, bytes], None] | None    # a message arrived (else: recv())
    on_ready: Callable[[], None] | None                   # recv() has something
    on_writable: Callable[[ConnId], None] | None          # send() may go on
    on_event: Callable[[str, dict], None] | None          # what the backend tells (membership, resets)

    @abc.abstractmethod
    def connect(self, server_group: int, conn_seq: int) -> ConnId:
        """A connection to server_group; the server side accepts implicitly."""

    @abc.abstractmethod
    def writable(self, cid: ConnId) -> bool:
        """Whether send() has room (flow control)."""

    @abc.abstractmethod
    def send(self, cid: ConnId, payload: bytes, order_info: bytes = b"") -> int:
        """Sends payload; order_info: the ordering entries it waits for."""

    @abc.abstractmethod
    def recv(self) -> tuple[ConnId, bytes] | None:
        """The next message delivered, in order, or None."""

    @abc.abstractmethod
    def finish(self, cid: ConnId) -> None:
        """The application ended cid both ways: forgotten once quiet."""

    @abc.abstractmethod
    def count_drop(self, reason: str) -> None:
        """Counts something dropped (what llft-status shows, by reason)."""

    @abc.abstractmethod
    def stats(self) -> dict:
        """Counts, drops by reason, buffers: what llft-status shows."""

    @abc.abstractmethod
    def close(self) -> None: ...


class NewcomerAdmission(abc.ABC):
    """At the primary: newcomers being admitted.  The core decides what a
    newcomer's state is (history, or a checkpoint taken meanwhile)."""
    pending: dict   # newcomers admitted whose state is not yet offered

    @abc.abstractmethod
    def begin(self, member: int) -> None:
        """member is in the view from here on; its state comes later."""

    @abc.abstractmethod
    def complete(self, member: int, state, what: str) -> None:
        """member's state (a FileState or bytes) is offered from this host."""

    @abc.abstractmethod
    def offered_elsewhere(self, member: int, offer: dict, what: str) -> None:
        """member's state is offered by another member (offer: where)."""

    @abc.abstractmethod
    def refuse(self, member: int, why: str) -> None:
        """member is not admitted."""

    @abc.abstractmethod
    def abandon(self, member: int, why: str) -> None:
        """member's admission begun is given up: it leaves the view."""


class Membership(abc.ABC):
    """A member's membership protocol: views, elections, removals, the
    take-over of a new primary, and admissions.  It tells the core through
    MemberHooks; tick() raises Excluded when this member must leave."""
    admission: NewcomerAdmission | None   # the primary's
    taking_over: bool

    @abc.abstractmethod
    def become_primary(self) -> None:
        """This member founded the group: it admits and removes."""

    @abc.abstractmethod
    def tick(self) -> None: ...

    @abc.abstractmethod
    def ending_tick(self) -> None:
        """The primary's program ended and it waits for its backups."""

    @abc.abstractmethod
    def accepted(self, seen: list) -> None:
        """A newcomer's replica runs: it acknowledges its own admission."""

    @abc.abstractmethod
    def settle_for(self, seconds: float) -> None:
        """The current primary took over this recently (a newcomer's view)."""

    @abc.abstractmethod
    def settling_left(self) -> float:
        """Seconds left of this primary's settling time after its takeover."""

    @abc.abstractmethod
    def program_ended(self) -> None:
        """The primary's program ended: nothing is left to take over."""

    @abc.abstractmethod
    async def take_over(self, view: View, acks: dict) -> dict[ConnId, int] | None:
        """After hooks.elected: the cut at which the old view ends.  Returns
        per connection the message after which the new primary's go on;
        None if this member must leave instead."""

    @abc.abstractmethod
    def took_over(self) -> None:
        """The core runs as the new view's primary."""

    @abc.abstractmethod
    def checkpoint_source(self, newcomer: int) -> int | None:
        """The backup best placed to be checkpointed for newcomer, if any."""

    @abc.abstractmethod
    async def ask_checkpoint(self, source: int, newcomer: int) -> dict:
        """Asks backup source for newcomer's checkpoint: where it is offered
        (SourceRefused if it gives none)."""

    @abc.abstractmethod
    def fault_timeout_applied(self, configured: float) -> float:
        """The fault timeout in force (longer after long silences)."""

    @abc.abstractmethod
    def failover_times(self) -> dict:
        """CLOCK_MONOTONIC times of this member's last primary change."""

    @abc.abstractmethod
    def close(self) -> None: ...


class GroupMember(Connections):
    """One member's end of its group: connections, the primary's ordering
    information to the backups, its membership, and what a newcomer takes
    over (per connection: how far it is, and what follows)."""
    me: int
    on_order: Callable[[int, bytes], None] | None       # a backup: an entry released, in order
    on_order_added: Callable[[int, bytes], None] | None   # the primary: an entry it ordered
    membership: Membership | None

    # -- the group ---------------------------------------------------------
    @property
    @abc.abstractmethod
    def view(self) -> View: ...

    @property
    @abc.abstractmethod
    def is_primary(self) -> bool: ...

    @abc.abstractmethod
    def datagram(self, data: bytes, addr) -> bool:
        """A datagram of the group's port; True if it carried client traffic."""

    @abc.abstractmethod
    async def join(self, found_after: float, give_up_after: float, restores: bool, spool) -> Joined | None:
        """Joins the group (None: nobody there, this member founds it);
        JoinRefused if it is not taken in."""

    @abc.abstractmethod
    def found(self) -> None:
        """This member founds the group as its primary."""

    @abc.abstractmethod
    def adopt(self, joined: Joined) -> None:
        """Takes up the view and ordering position joined gave."""

    @abc.abstractmethod
    def start(self) -> None: ...

    @abc.abstractmethod
    def start_membership(self, unread: Callable[[], bool], opts, hooks: MemberHooks) -> Membership:
        """The membership protocol of this member, once its replica runs."""

    # -- ordering information ------------------------------------------------
    @abc.abstractmethod
    def order(self, blob: bytes) -> int:
        """The primary orders blob: its oseq."""

    @abc.abstractmethod
    def ordered_upto(self) -> int:
        """The last oseq the primary ordered, or a backup released."""

    @abc.abstractmethod
    def order_stable(self, oseq: int) -> bool:
        """Every backup holds the entries up to oseq."""

    @abc.abstractmethod
    def backups_hold_all_received(self) -> bool:
        """Every backup holds every client message this member received."""

    @abc.abstractmethod
    def heartbeat_now(self) -> None:
        """Tells the group at once how far this member is."""

    @abc.abstractmethod
    def drop_counts(self) -> dict[str, int]:
        """Datagrams and messages dropped, by reason."""

    @abc.abstractmethod
    def expected_drops(self) -> set[str]:
        """Drop reasons that are routine (logged quietly)."""

    @abc.abstractmethod
    def buffers(self) -> dict[str, int]: ...

    # -- connections as a newcomer takes them over -----------------------------
    @abc.abstractmethod
    def connections(self) -> list[ConnId]: ...

    @abc.abstractmethod
    def has_connection(self, cid: ConnId) -> bool: ...

    @abc.abstractmethod
    def sent_count(self, cid: ConnId) -> int:
        """Messages this member generated on cid."""

    @abc.abstractmethod
    def retired(self) -> dict[ConnId, int]:
        """Connections ended and forgotten: messages sent on each."""

    @abc.abstractmethod
    def retire(self, cid: ConnId, sent: int) -> None:
        """cid is over here (a newcomer's transferred state)."""

    @abc.abstractmethod
    def connection_state(self, cid: ConnId) -> tuple[int, int, int]:
        """(messages consumed, ours acknowledged, first of ours still kept)."""

    @abc.abstractmethod
    def adopt_connection(self, cid: ConnId, consumed: int, acked: int, logged_from: int) -> None:
        """A newcomer takes over cid at the state connection_state gave."""

    @abc.abstractmethod
    def unconsumed(self, cid: ConnId) -> list[bytes]:
        """Messages of cid released to this member but not yet taken."""

    @abc.abstractmethod
    def number_from(self, cid: ConnId, count: int) -> None:
        """This member's next message on cid is number count + 1."""

    @abc.abstractmethod
    def rebase(self, cid: ConnId, base: int) -> list[bytes]:
        """A new view: cid's messages go on after base; returns those this
        member had sent past it (to be sent again, renumbered)."""

    @abc.abstractmethod
    def forgotten(self) -> list:
        """Connections forgotten here (a newcomer must not take them anew)."""

    @abc.abstractmethod
    def adopt_forgotten(self, listed: list) -> None: ...


def member_backend(name: str, gid: int, me: int, loop, transport, key: bytes, config=None) -> GroupMember:
    """The backend --order names, for one member across hosts."""
    if name == "llft":
        from llft.ordering.llmp.member import LlmpMember
        return LlmpMember(gid, me, loop, transport, key, config)
    raise ValueError(f"--order {name} does not reach across hosts (there are: {', '.join(ORDERS_ACROSS_HOSTS)})")


async def open_gateway(name: str, gid: int, server_group: int, group_port: int, interface: str, loop,
                       key: bytes) -> Connections:
    """A gateway's end (group gid) of its connections to server_group, over --order name."""
    if name == "llft":
        from llft.ordering.llmp.gateway import open_gateway_end
        return await open_gateway_end(gid, server_group, group_port, interface, loop, key)
    raise ValueError(f"--order {name} does not reach across hosts (there are: {', '.join(ORDERS_ACROSS_HOSTS)})")
