"""SQLite settings for the test deployments' Airflow metadata database.

A test deployment's scheduler, API server, DAG processor, triggerer and the test's own ``airflow``
commands all write one SQLite file (in WAL mode, as Airflow opens it). Two things make a writer fail
with "database is locked" on a loaded machine:

- SQLite's default busy wait (5 s) is shorter than a write a busy scheduler can hold the lock for:
  every component waits up to a minute instead (``timeout``).
- A transaction that began deferred reads a snapshot before it asks for the write lock; when another
  connection committed meanwhile, SQLite refuses the write at once, without any busy wait (seen with
  ``airflow backfill create`` clearing a run beside a busy scheduler, three tries in a row). Write
  transactions therefore begin ``IMMEDIATE`` (``isolation_level``: Python's sqlite3 issues
  ``BEGIN IMMEDIATE`` before a transaction's first write), taking the write lock before they read, so
  they wait their turn instead.
"""

CONNECT_ARGS = {"timeout": 60, "isolation_level": "IMMEDIATE"}
"""Imported by Airflow through ``[database] sql_alchemy_connect_args``."""
