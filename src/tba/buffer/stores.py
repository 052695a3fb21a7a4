"""Chooses the store from its URL, so that only a Redis deployment imports redis."""

from __future__ import annotations

from tba.buffer.store import BufferStore, StoreLimits
from tba.errors import InvalidArgumentError

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def open_store(url: str, key_prefix: str, limits: StoreLimits) -> BufferStore:
    """`memory` for the embedded store, or a redis:// (rediss://, unix://) URL."""
    if url == "memory":
        from tba.buffer.memory_store import MemoryStore

        return MemoryStore(limits)
    if url.startswith(REDIS_SCHEMES):
        from tba.buffer.redis_store import RedisStore

        return RedisStore(url, key_prefix, limits)
    raise InvalidArgumentError(f"unknown store {url!r}: use `memory` or a redis:// URL")
