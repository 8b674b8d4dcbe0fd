"""A batch's life in one room.

The path of one table batch (:class:`relay.batch.life.Deliveries`): taken
(``CLAIMED``) once the loop built its claim; it waits for the batch before it
to be handed over; renewed if its lease is nearly over (or ``GIVEN_BACK``);
``HANDED`` to the sink with the key holds; ``JUDGED``
(:mod:`relay.batch.costs` sorts the answers and charges each kind of "not
acknowledged"); ``SETTLED`` by its source within its lease.
"""

from relay.batch.costs import Costs, Verdict, judge
from relay.batch.life import Batch, Deliveries, State

__all__ = ["Batch", "Costs", "Deliveries", "State", "Verdict", "judge"]
