"""What every client of the harness shares: one SSL context.

httpx builds an SSL context for each client it makes (loading the CA bundle: ~35 ms of CPU
on this box), and `httpx.post` makes a client per call. With a client per request (each
attack and each victim request opens its own connection, as a fresh client does), the
harness spent about a core building them, on the two cores the server and the victim share.
Built once and passed as `verify`, a new client costs ~0.5 ms; the requests the servers see
are the same (loopback HTTP: the context is never used).
"""

from __future__ import annotations

import httpx

SSL_CONTEXT = httpx.create_ssl_context()
