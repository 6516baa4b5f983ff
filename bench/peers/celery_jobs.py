"""Celery 5.7 benchmark task and enqueuers (Redis broker, no result backend).

Enqueue is one ``apply_async`` per job (Celery has no bulk publish). Worker:
``celery -A bench.peers.celery_jobs worker -P prefork -c 2 --loglevel WARNING``
with Celery's defaults otherwise (prefetch multiplier 4, acks_late off).
"""

from __future__ import annotations

import time

from celery import Celery

from bench.peers.common import paced, redis_url, run_job

app = Celery("bench", broker=redis_url())
app.conf.broker_connection_retry_on_startup = True


@app.task(name="bench_job")
def bench_job(shape: str, ts: float) -> None:
    run_job(shape, ts)


def _warm() -> None:
    with app.connection_for_write() as conn:
        conn.ensure_connection()


def enqueue_bulk(n: int, shape: str) -> float:
    _warm()
    started = time.perf_counter()
    for _ in range(n):
        bench_job.apply_async((shape, 0))
    return time.perf_counter() - started


def enqueue_paced(rate: float, seconds: float, shape: str) -> tuple[int, float]:
    _warm()
    return paced(rate, seconds, lambda ts: bench_job.apply_async((shape, ts)))
