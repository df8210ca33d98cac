"""Selectors: read-only queries (the API, the admin, the commands and the exports read
through them). One module per read domain; writes go through ``integrations.services``."""
