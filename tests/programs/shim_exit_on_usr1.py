"""Say "ready", then wait; SIGUSR1 makes it exit with the code given (default 5).

Every other signal has its default action (SIGTERM kills it).
"""

import signal
import sys

code = int(sys.argv[1]) if len(sys.argv) > 1 else 5
signal.signal(signal.SIGUSR1, lambda signum, frame: sys.exit(code))
print("ready", flush=True)
while True:
    signal.pause()
