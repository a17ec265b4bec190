"""A real, deterministic embedding for tests: character trigrams of each word (with
its boundaries) hashed into a fixed number of signed buckets, L2-normalised.

Texts that share word pieces are close ("vegetarian" and "vegetarians", "espresso"
and "espressos"), texts that share none are orthogonal-ish: enough to tell by vector
similarity what a keyword engine without stemming cannot find, and fast.
"""

from __future__ import annotations

import asyncio
import math
import re
import zlib

__all__ = ["HashingEmbedding", "SmallHashing"]

_WORD = re.compile(r"\w+")


class HashingEmbedding:
    """The :class:`tenxstore.embeddings.Embedding` protocol, in plain Python."""

    def __init__(self, dims: int = 256, model_id: str = "test-hashing-trigrams") -> None:
        self.dims = dims
        self.model_id = model_id
        self.calls = 0

    def _one(self, text: str) -> list[float]:
        vector = [0.0] * self.dims
        for word in _WORD.findall(text.casefold()):
            padded = f"<{word}>"
            for i in range(max(1, len(padded) - 2)):
                gram = padded[i : i + 3].encode()
                h = zlib.crc32(gram)
                vector[h % self.dims] += 1.0 if (h >> 16) & 1 else -1.0
        norm = math.sqrt(sum(v * v for v in vector))
        return [v / norm for v in vector] if norm else vector

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.calls += 1
        return [self._one(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        await asyncio.sleep(0)
        return self.embed_documents(texts)

    async def aembed_query(self, text: str) -> list[float]:
        return (await self.aembed_documents([text]))[0]


class SmallHashing(HashingEmbedding):
    """Another model (for ``tenxstore memories reembed --embedding``): 32 dims."""

    def __init__(self) -> None:
        super().__init__(dims=32, model_id="small-hashing")
