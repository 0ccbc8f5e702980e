"""The node's OpenAI-compatible endpoint (issue 21, docs/front.md): one address
for every instance, routed by ``model``, a client of the node like the control API."""

from .server import FrontServer
from .settings import FrontConfig

__all__ = ["FrontConfig", "FrontServer"]
