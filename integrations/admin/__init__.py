"""Django admin for staff: one module per model group (a kind of integration: one module).

Every module of this package is imported here, so one that registers a ModelAdmin (a new
kind's, say) needs no line of its own.
"""

from importlib import import_module
from pkgutil import iter_modules

for _module in iter_modules(__path__):
    import_module(f"{__name__}.{_module.name}")
