"""Serving clients: the gateway that real TCP clients connect to, and the
per-replica relays that turn each client connection into a connection to
the program's virtual listener."""
