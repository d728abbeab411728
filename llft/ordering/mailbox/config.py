"""The timing constants of the mailbox protocols and the bounds derived
from them (specs/mailbox.md §2.5, §7).  Every value is in nanoseconds of
the local clock.  The per-copy maxima are what one step on one copy may
take; a process that overruns them has a timing failure, which Protocol 1
tolerates only in receivers that are late, and Protocol 2 in up to
⌊(N−1)/2⌋ receivers."""
from __future__ import annotations

from dataclasses import dataclass


class ConfigError(ValueError):
    """Constants that break a bound the protocols rely on."""


@dataclass(frozen=True)
class Timing:
    delta_s: int = 2_000_000      # write a message into one copy
    delta_f: int = 1_000_000      # set the a-flag in one copy
    delta_d: int = 4_000_000      # one decision slot in one copy
    delta_r: int = 1_000_000      # read a message's data from one copy
    delta_fd: int = 1_000_000     # set this receiver's d-flag (and remove) in one copy
    poll: int = 1_000_000         # δ: an idle Protocol 1 receiver's polling period
    rho: int = 1_000_000          # ρ: the most a Protocol 2 receiver takes to notice a message
    epsilon: int = 1_000_000      # ε: clocks of intact processes differ by less
    expiry: int = 0               # X (Protocol 2); 0: the least the bound allows
    delta_j: int = 5_000_000      # a Join
    delta_l: int = 5_000_000      # a Leave
    crash_delay: int = 0          # the wait for a copy found crashed; 0: ε (§5.3)

    def send_bound(self, copies: int) -> int:
        """Δs: the most a whole Send takes."""
        return copies * (self.delta_s + self.delta_f)

    def receive_bound(self, copies: int, protocol: int) -> int:
        """Δr: the most a whole Receive takes from its decision start."""
        per_copy = self.delta_d + self.delta_r + self.delta_fd
        if protocol == 1:
            return copies * (per_copy + self.epsilon)
        return copies * per_copy + self.rho + self.epsilon

    def least_expiry(self, copies: int) -> int:
        """X ≥ Δs + ρ + n·δd + 2ε: intact receivers have time to form a
        quorum on an intact sender's message before it expires."""
        return self.send_bound(copies) + self.rho + copies * self.delta_d + 2 * self.epsilon

    def expiry_for(self, copies: int) -> int:
        return self.expiry or self.least_expiry(copies)

    def crash_wait(self) -> int:
        return self.crash_delay or self.epsilon

    def check(self, copies: int, protocol: int) -> None:
        if copies < 1:
            raise ConfigError(f"a mailbox needs at least one copy, not {copies}")
        if protocol not in (1, 2):
            raise ConfigError(f"protocol {protocol}: the mailbox protocols are 1 (crash failures) "
                              f"and 2 (timing failures)")
        for name, value in vars(self).items():
            if value < 0:
                raise ConfigError(f"{name} is negative ({value} ns)")
        if protocol == 2 and self.expiry and self.expiry < self.least_expiry(copies):
            raise ConfigError(f"expiry X = {self.expiry} ns is below Δs + ρ + n·δd + 2ε = "
                              f"{self.least_expiry(copies)} ns for {copies} copies: intact "
                              f"receivers could not decide an intact sender's message in time")


def quorum(receivers: int) -> int:
    """μ = ⌈(N+1)/2⌉."""
    return (receivers + 2) // 2


def tolerated_receivers(receivers: int, protocol: int) -> int:
    """t: receivers that may fail (Protocol 1: any number)."""
    return receivers if protocol == 1 else (receivers - 1) // 2
