"""The pure rules: what the package decides, with no Celery, Django, I/O or clock.

Every function here takes the instant it judges (``now``) and the values it needs and
returns a value; the tiers above read the time (``celery_deadlines.clock``), talk to
Celery, the broker and the database, and act on what these rules return. The map of
the tiers is in DEVELOPERS.md ("The tiers"); ``tests/repository/test_architecture.py`` holds
it, deriving each module's tier from its path.
"""
