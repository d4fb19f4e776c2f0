"""``python -m fastmace`` is the ``fastmace`` command."""

import sys

from fastmace.cli.main import main

sys.exit(main())
