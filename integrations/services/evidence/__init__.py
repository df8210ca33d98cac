"""What auditors get: evidence packs, export records."""
