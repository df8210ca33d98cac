"""Reporting statuses to DROP: response files written, uploaded, amended."""
