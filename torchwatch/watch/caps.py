"""``torchwatch serve``'s caps on the trainings it watches at once (:class:`torchwatch.watch.fleet.Fleet`),
in a module of their own so that ``--help`` reads them without loading the watch machinery.

Each training watched costs a session (a few threads, ~1 % of a core at the fast cadence) and a
py-spy process (half of that): what any user could make root spend by starting processes that look
like trainings is bounded by them. 16: two trainings per GPU of an 8-GPU node; 4 a user: one user's
look-alikes cannot take every place.
"""

MAX_TRAININGS = 16
MAX_PER_USER = 4
