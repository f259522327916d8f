-- The store's own statements (celery_deadlines.ledger.sql.connection). Each statement
-- under its name; the format and the slots in braces:
-- celery_deadlines/ledger/sql/statements.py.

-- database_now --
-- The database clock.
SELECT {now}
