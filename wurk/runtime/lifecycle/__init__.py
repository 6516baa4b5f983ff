"""The job lifecycle: the one skeleton every run follows, and the steps features add to it."""
