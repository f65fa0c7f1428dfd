"""Leaves the file named by its argument the moment it starts (tests of bad input: it must not start)."""

import sys

with open(sys.argv[1], "w") as f:
    f.write("started\n")
