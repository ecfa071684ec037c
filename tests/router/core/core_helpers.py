from kv.hashing import block_hashes, namespace_root

BLOCK_SIZE = 4
ROOT = namespace_root("m")


def h(i: int) -> bytes:
    """A readable stand-in block hash: 16 bytes, distinct per i."""
    return i.to_bytes(16, "big")


def chain(*token_runs: list[int]) -> list[bytes]:
    """Real Protocol 1 hashes of the concatenated token runs (BLOCK_SIZE tokens per block)."""
    tokens = [t for run in token_runs for t in run]
    return block_hashes(tokens, BLOCK_SIZE, ROOT)


class FakeClock:
    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
