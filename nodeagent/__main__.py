"""``python -m nodeagent``: same as the ``prewarm-agent`` command."""

import sys

from nodeagent.cli import main

sys.exit(main())
