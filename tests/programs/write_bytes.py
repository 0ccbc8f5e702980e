"""Write N bytes (argv[1]) of filler to stdout ending in "<END>", and "done" to stderr."""

import sys

n = int(sys.argv[1])
filler = n - len(b"<END>")
out = sys.stdout.buffer
chunk = b"0123456789abcdef" * 4096
while filler > 0:
    piece = chunk[: min(filler, len(chunk))]
    out.write(piece)
    filler -= len(piece)
out.write(b"<END>")
out.flush()
print("done", file=sys.stderr, flush=True)
