"""What the training DAG's tasks do: the Python tasks, the job operator, pools, assets, the report."""
