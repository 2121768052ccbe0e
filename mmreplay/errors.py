"""``mmreplay.errors``: the typed error hierarchy (defined in :mod:`mmreplay.core.errors`)."""

from .core.errors import *  # noqa: F403
from .core.errors import __all__  # noqa: F401
