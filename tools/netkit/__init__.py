"""What every server the node runs shares: the control API, the front, the witness.

:mod:`.listener` binds their TCP listeners (a refused address becomes a
``ListenError`` naming the configuration key) and gives the uvicorn settings
they share. Nothing here imports another subpackage of ``tools``, so each
server's package may import it without a cycle.
"""
