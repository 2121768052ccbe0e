"""``mmreplay.schema``: Field and Schema (defined in :mod:`mmreplay.core.schema`)."""

from .core.schema import *  # noqa: F403
from .core.schema import __all__  # noqa: F401
