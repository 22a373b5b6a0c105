"""Settings: the embedded default when no DATABASE_URL/REDIS_URL is set, production otherwise.

Topics live in their own modules; this one picks the mode and pulls them together.
"""

from .base import *  # noqa: F401,F403
from .limits import *  # noqa: F401,F403
from .security import *  # noqa: F401,F403
from .services import *  # noqa: F401,F403
