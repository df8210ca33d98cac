"""Service providers and contractors, and the signed directives that tell them to delete."""
