"""The run ledger's SQL: every statement, each one conditional on the database clock.

``dialect``     the few expressions that differ between PostgreSQL and SQLite: the clock
``connection``  :class:`Store`: a connection on one Django alias, and the statement groups
``predicates``  the SQL fragments made from :mod:`celery_deadlines.rules.states`; the claim's
                condition, written once
``rows``        the plain values the statements take and return
``runs``        the producer's and the attempt's statements on the run row
``sweeps``      the reconciler's and the scheduler's
``operator``    the admin's actions
``console``     the admin's reads at any size: a filter's values by a loose index scan
``effects``     the effect ledger's (intent, the dispatch guard, outcomes, settlement)
``plans``       plans stored with the run
``retention``   the purge of ended runs (the reconciler and ``manage.py deadlines purge``)
"""
