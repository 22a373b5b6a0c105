"""Long-poll fallback of the agents' job socket (docs/agent-protocol.md).

``GET /api/agents/jobs/?wait=25`` answers at once with the ``job.assign`` messages the node has
not acknowledged, or waits up to ``wait`` seconds for one to be published to its group. It is an
async view so a waiting agent holds no worker thread. Its token is checked again whenever it
wakes (a job, a second gone, or ``agent.revoked`` sent to the node's group when the token is
revoked): a revoked token's wait ends at once with 401 and no job. ``POST /api/agents/jobs/<id>/events/`` takes
the same ``job.ack`` / ``job.progress`` / ``job.result`` messages as the socket.
"""

from __future__ import annotations

import asyncio
import time

from channels.layers import get_channel_layer
from django.db import transaction
from django.http import JsonResponse
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response

from controlplane.accounts.authentication import INVALID_TOKEN, AgentAuthFailed
from controlplane.api.exceptions import ApiError
from controlplane.api.limits import check_body_size
from controlplane.realtime import groups
from controlplane.replication.jobs.delivery import apply_event

from .jobs import agent_token, pending, token_live
from .reports import AgentView

MAX_WAIT_S = 25


def _error(status: int, code: str, detail: str, field: str | None = None) -> JsonResponse:
    return JsonResponse({"error": code, "detail": detail, "field": field}, status=status)


@transaction.non_atomic_requests
async def agent_jobs(request):
    if request.method != "GET":
        return _error(405, "method_not_allowed", "use GET")
    try:
        node_id, token_id = await agent_token(request.headers.get("Authorization"))
    except AgentAuthFailed as exc:
        code = "not_authenticated" if exc.status == 401 else "permission_denied"
        return _error(exc.status, code, exc.detail)
    try:
        wait = float(request.GET.get("wait", "0"))
    except ValueError:
        return _error(400, "invalid", "wait must be a number of seconds", "wait")
    if not 0 <= wait <= MAX_WAIT_S:
        return _error(400, "invalid", f"wait must be between 0 and {MAX_WAIT_S}", "wait")
    layer = get_channel_layer()
    channel = await layer.new_channel() if layer else None
    if channel:
        # Join before reading the database, so a job published in between is not missed.
        await layer.group_add(groups.agent(node_id), channel)
    try:
        deadline = time.monotonic() + wait
        while True:
            if not await token_live(token_id):
                return _error(401, "not_authenticated", INVALID_TOKEN)
            jobs = await pending(node_id)
            left = deadline - time.monotonic()
            if jobs or left <= 0:
                return JsonResponse(jobs, safe=False)
            try:
                if channel:
                    await asyncio.wait_for(layer.receive(channel), min(left, 1.0))
                else:
                    await asyncio.sleep(min(left, 0.25))
            except TimeoutError:
                pass  # re-read the database at least once a second
    finally:
        if channel:
            await layer.group_discard(groups.agent(node_id), channel)


class JobEventsView(AgentView):
    """An agent's job.ack / job.progress / job.result for one of its jobs."""

    @extend_schema(request=dict, responses={200: dict}, tags=["agents"])
    def post(self, request, job_id):
        check_body_size(request, 64 * 1024)
        msg = request.data if isinstance(request.data, dict) else None
        if msg is None:
            raise ApiError("invalid", "expected a JSON object", None)
        if str(msg.get("job_id", job_id)) != str(job_id):
            raise ApiError("invalid", "job_id in the body differs from the URL", "job_id")
        job = apply_event(self.node(request).pk, {**msg, "job_id": str(job_id)})
        return Response({"job_id": str(job.pk), "state": job.state})
