"""Reliable, ordered, bounded-time multicast through replicated
shared-memory mailboxes (seeds/mailbox-multicast.txt, specs/mailbox.md):
n copies of a mailbox, each in a shared-memory segment of its own, of
which f < n may fail; Protocol 1 tolerates crashed processes, Protocol 2
also up to ⌊(N−1)/2⌋ receivers with timing failures."""
