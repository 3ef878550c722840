"""What a run does, decided once: the request, the jobs, their resources and the remote layout."""
