"""Drives a live broker with the Python client generated from its /openapi.json.

Run by scripts/openapi-check.sh, which starts the broker, generates `switchyard_client` into
target/openapi/client and sets PYTHONPATH, SWITCHYARD_URL and SWITCHYARD_TOKEN (a developer of
team `ml`). The broker has no agents, so a submitted job waits in the queue until cancelled.

Every call goes through the generated functions with `raise_on_unexpected_status`, so a status the
document does not list for an operation fails, and every body is parsed into the generated models,
so a body that does not match its schema fails too.
"""

from __future__ import annotations

import os
import sys
import uuid
from http import HTTPStatus
from typing import Any, TypeVar

import httpx
from switchyard_client import AuthenticatedClient
from switchyard_client.api.jobs import cancel_job, get_job, list_jobs, submit_job
from switchyard_client.models import (
    ErrorBody,
    JobList,
    JobSpec,
    JobState,
    JobView,
    ResourceSpec,
)
from switchyard_client.types import Response

T = TypeVar("T")


def expect(response: Response[Any], status: HTTPStatus, kind: type[T]) -> T:
    """The parsed body of `response`, which must have `status` and a body of type `kind`."""
    parsed = response.parsed
    if response.status_code != status or not isinstance(parsed, kind):
        sys.exit(
            f"expected {status.value} with a {kind.__name__}, got {response.status_code.value}: "
            f"{response.content.decode(errors='replace')[:500]}"
        )
    return parsed


def expect_error(response: Response[Any], status: HTTPStatus, code: str) -> ErrorBody:
    """`response` must be the error `status` with `error.code` == `code`."""
    body = expect(response, status, ErrorBody)
    if body.error.code != code:
        sys.exit(f"expected error code {code!r} with {status.value}, got {body.error.code!r}")
    return body


def main() -> None:
    base = os.environ["SWITCHYARD_URL"] + "/api/v1"
    token = os.environ["SWITCHYARD_TOKEN"]
    timeout = httpx.Timeout(10.0)
    client = AuthenticatedClient(
        base_url=base, token=token, raise_on_unexpected_status=True, timeout=timeout
    )
    name = f"openapi-client-{uuid.uuid4().hex[:8]}"
    spec = JobSpec(name=name, team="ml", command=["sleep", "600"], resources=ResourceSpec(gpus=1))
    key = uuid.uuid4().hex

    with client:
        # Submit; the same request with the same Idempotency-Key is the same job (200).
        job = expect(
            submit_job.sync_detailed(client=client, body=spec, idempotency_key=key),
            HTTPStatus.CREATED,
            JobView,
        )
        print(f"submitted {job.id} ({job.state.value})")
        if job.name != name or job.team != "ml" or job.state != JobState.QUEUED:
            sys.exit(f"submitted job is not what was sent: {job.to_dict()}")
        again = expect(
            submit_job.sync_detailed(client=client, body=spec, idempotency_key=key),
            HTTPStatus.OK,
            JobView,
        )
        if again.id != job.id:
            sys.exit(f"a retry with the same Idempotency-Key made another job: {again.id}")

        # Read it, and find it in the list.
        read = expect(get_job.sync_detailed(str(job.id), client=client), HTTPStatus.OK, JobView)
        if read.id != job.id or read.spec.command != ["sleep", "600"]:
            sys.exit(f"read another job: {read.to_dict()}")
        jobs = expect(
            list_jobs.sync_detailed(client=client, team="ml", limit=500), HTTPStatus.OK, JobList
        )
        if job.id not in [j.id for j in jobs.jobs]:
            sys.exit(f"job {job.id} is not in the list of team ml's jobs")
        print(f"read {read.id}, and found it among {len(jobs.jobs)} jobs")

        # Cancel it: a queued job is cancelled at once, and reads cancelled.
        cancelled = expect(
            cancel_job.sync_detailed(str(job.id), client=client), HTTPStatus.ACCEPTED, JobView
        )
        read = expect(get_job.sync_detailed(str(job.id), client=client), HTTPStatus.OK, JobView)
        if cancelled.state != JobState.CANCELLED or read.state != JobState.CANCELLED:
            sys.exit(f"cancel answered {cancelled.state.value}, the job reads {read.state.value}")
        print(f"cancelled {job.id}")

        # The documented errors arrive as typed error bodies.
        expect_error(
            cancel_job.sync_detailed(str(job.id), client=client), HTTPStatus.CONFLICT, "conflict"
        )
        expect_error(
            get_job.sync_detailed(str(uuid.uuid4()), client=client),
            HTTPStatus.NOT_FOUND,
            "not_found",
        )
    stranger = AuthenticatedClient(
        base_url=base, token="not-a-token", raise_on_unexpected_status=True, timeout=timeout
    )
    with stranger:
        expect_error(
            get_job.sync_detailed(str(job.id), client=stranger),
            HTTPStatus.UNAUTHORIZED,
            "unauthorized",
        )
    print("openapi client: submit, read, list, cancel and the errors all as documented")


if __name__ == "__main__":
    main()
