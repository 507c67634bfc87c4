"""Pure decision logic: which draft length k to verify for a request, and why."""
