"""Where in the user's code an op was called (implemented in ``fake._source``)."""

from torchdefer.fake._source import SourceLocation, user_frame

__all__ = ["SourceLocation", "user_frame"]
