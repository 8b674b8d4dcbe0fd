"""``python -m devservers [--port N]``: Tansu, a development Kafka broker, until Ctrl-C or SIGTERM."""

from devservers.tansu import main

raise SystemExit(main())
