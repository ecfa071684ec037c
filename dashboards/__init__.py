"""Grafana dashboard and Prometheus rules of kvroute, with the tools that prove them live."""
