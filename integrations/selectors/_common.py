"""What several read domains share."""

from integrations.list_types import DATA_TYPE_OF

# (hash_type, DROP's name) pairs, in display order.
LIST_TYPES = tuple(DATA_TYPE_OF.items())
