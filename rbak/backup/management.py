"""The backup side's names for the one Management API client (``rbak.management``)."""

from __future__ import annotations

from ..management import ManagementClient, QueueInfo, q

__all__ = ["ManagementClient", "QueueInfo", "q"]
