"""Example services around the relay; not part of it, and not in its wheel or image.

- ``python -m examples.demo`` (``make demo``): the shop, the relay and a consumer
  end to end on throwaway servers, checked for lost, leaked or reordered events.
- ``python -m examples.services shop|consumer``: the long-running shop and
  consumer that ``compose/`` runs.
"""
