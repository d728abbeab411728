"""llft-nemesis: a randomized, seeded fault-injection soak of replicated
servers, with clients whose every answer is checked (docs/nemesis.md)."""
