"""Running dropportal in production: health and readiness probes, Prometheus metrics, and
what the web processes do while PostgreSQL is unreachable (docs/deployment.md)."""
