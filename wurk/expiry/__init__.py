"""Expiry (Sidekiq Pro's ``expires_in``): a job fetched after its ``expiry`` is dropped unrun.

The push side writes ``expiry`` (``wurk.push.time_options``); the worker
side is :class:`wurk.expiry.step.ExpiryStep`, one step of the job's
lifecycle, registered in ``wurk.runtime.steps``.
"""
