"""The job scripts: rendering them from a plan, what their exit codes mean, how their failures read."""
