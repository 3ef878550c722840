"""SQLite settings for the test deployments' Airflow metadata database.

A test deployment's scheduler, API server, DAG processor, triggerer and the test's own ``airflow``
commands all write one SQLite file. SQLite's default busy wait (5 s) is shorter than a write a
loaded machine can hold the lock for, and the loser fails with "database is locked" (seen with
``airflow backfill create`` beside a busy scheduler). Every component waits up to a minute instead.
"""

CONNECT_ARGS = {"timeout": 60}
"""Imported by Airflow through ``[database] sql_alchemy_connect_args``."""
