"""The evidence pack's components: per audit component, its records, tests and result."""

from __future__ import annotations

from integrations.services.evidence.components import (
    actioning,
    drop_access,
    hashing,
    list_selection,
    matching,
    service_providers,
    standardization,
    status_reporting,
    suppression_list,
)
from integrations.services.evidence.components.base import Builder

# The pack's format is ``integrations.evidence.components``. Each component module has one
# builder, ``build(context) -> Component``, registered here under its key; the export runs them
# in the audit's order inside its snapshot. A builder may add files to the pack
# (``context.writer.write``) and names them in ``Component.files``:
#
#     component = Component(key="hashing", proves="...", cannot_prove="...")
#     component.test("DROP's test vectors", passed=not differences, detail="12 of 12 equal")
#     component.records["vectors"] = 12
#
# One line per component module, in the audit's order (``integrations.evidence.components.KEYS``);
# a key with none here is in the pack as a failed component ("no builder registered").
BUILDERS: dict[str, Builder] = {
    "list_selection": list_selection.build,
    "drop_access": drop_access.build,
    "standardization": standardization.build,
    "hashing": hashing.build,
    "matching": matching.build,
    "actioning": actioning.build,
    "status_reporting": status_reporting.build,
    "suppression_list": suppression_list.build,
    "service_providers": service_providers.build,
}
