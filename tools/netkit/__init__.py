"""What every server the node runs shares: the control API, the front, the witness.

:mod:`.listener` binds their TCP listeners (a refused address becomes a
``ListenError`` naming the configuration key) and gives the uvicorn settings
they share; :mod:`.framing` says which request framings their HTTP/1.1
listeners refuse, and how; :mod:`.bearer` what a bearer token the tools send
may hold. Nothing here imports another subpackage of ``tools``, so each
server's package may import it without a cycle.
"""
