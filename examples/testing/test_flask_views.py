"""Testing Flask views that push jobs (examples/flask_app.py), with no Redis."""

from __future__ import annotations

import pytest

import wurk.testing

flask = pytest.importorskip("flask")

from examples import flask_app  # noqa: E402 - only once Flask is known to be there
from examples.jobs import ChargeCard, send_welcome_email  # noqa: E402


@pytest.fixture
def client() -> flask.testing.FlaskClient:
    app = flask_app.create_app({"TESTING": True})
    return app.test_client()


def test_signup_pushes_a_welcome_email(client: flask.testing.FlaskClient,
                                       wurk_fake: wurk.testing.Fake) -> None:
    reply = client.post("/signup/7")

    [job] = wurk_fake.jobs_of(send_welcome_email)
    assert job.jid == reply.get_json()["enqueued"]
    assert job.args == [7, "user7@example.com"]


def test_a_push_through_the_apps_own_client_is_collected_too(
        client: flask.testing.FlaskClient, wurk_fake: wurk.testing.Fake) -> None:
    client.post("/orders/o-1/charge")

    [job] = wurk_fake.jobs_in("critical")
    assert job.job_class == ChargeCard.wurk_name and job.args == ["o-1", 1999]
