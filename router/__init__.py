"""kvroute's router: prefix index mirror, routing policies, the Router facade (router.core.router),
and the Ray Serve / gateway side. The core modules import no Ray and no torch.
"""
