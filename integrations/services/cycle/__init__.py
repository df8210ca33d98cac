"""A DROP cycle taken in: pulled, imported, matched, its requests created and settled."""
