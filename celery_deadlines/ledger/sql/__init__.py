"""The run ledger's SQL: every statement, each one conditional on the database clock.

Grouped by audience (the producer and the attempt, the worker's main process, the
reconciler, the operator, the console), each group a module; their map is DEVELOPERS.md's
("The tiers").
"""
