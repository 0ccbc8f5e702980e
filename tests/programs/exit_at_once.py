"""Exits with status 3 at once, whatever its arguments (a server that cannot start)."""

import sys

print("fatal: injected start failure", file=sys.stderr)
sys.exit(3)
