#!/bin/sh
# A wrapper script of the kind users run servers through: it execs the program.
exec "$@"
