"""``python -m relay`` is the ``outbox-relay`` command."""

import sys

from relay.launch import main

sys.exit(main())
