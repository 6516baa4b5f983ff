"""Pushing jobs: the job registry and decorators, the client, buffered and
confirmed pushes, the spool.
"""
