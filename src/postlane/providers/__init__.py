"""Provider adapters: the edge where Postlane meets the outside world."""

from postlane.providers.base import Capabilities, Provider

__all__ = ["Capabilities", "Provider"]
