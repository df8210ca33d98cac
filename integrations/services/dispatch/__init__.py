"""Handing requests to the broker's systems and taking their answers back."""
