"""``python -m relay`` is the ``outbox-relay`` command."""

import sys

from relay.cli import main

sys.exit(main())
