"""The backup side's names for the one Management API client (``rbak.broker.management``)."""

from __future__ import annotations

from ..broker.management import ManagementClient, QueueInfo, q

__all__ = ["ManagementClient", "QueueInfo", "q"]
