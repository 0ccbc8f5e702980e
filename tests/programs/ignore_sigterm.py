"""Ignore SIGTERM, say "ready", then wait forever (only SIGKILL ends it)."""

import signal

signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
while True:
    signal.pause()
