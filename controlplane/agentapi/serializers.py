"""What agents send and get back on enrolment, reports, heartbeats and token rotation."""

from rest_framework import serializers


class EnrolSerializer(serializers.Serializer):
    enrolment_token = serializers.CharField(max_length=200)
    hostname = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$")
    labels = serializers.DictField(
        child=serializers.CharField(max_length=200), required=False, default=dict
    )
    # Proof for re-enrolling a name already enrolled: the node's enrolment secret or its current
    # agent token, both kept in the agent's state.
    node_secret = serializers.CharField(max_length=200, required=False, default="")
    agent_token = serializers.CharField(max_length=200, required=False, default="")


class EnrolResponseSerializer(serializers.Serializer):
    node_id = serializers.IntegerField()
    agent_token = serializers.CharField()
    node_secret = serializers.CharField(
        help_text="kept by the agent: it proves the node's identity when it enrols again"
    )
    report_interval_s = serializers.FloatField()


class RotateTokenResponseSerializer(serializers.Serializer):
    agent_token = serializers.CharField()


class ReportDocSerializer(serializers.Serializer):
    """Documentation of the report body (docs/agent-protocol.md); parsed by core.agent_report."""

    seq = serializers.IntegerField(min_value=1)
    boot_id = serializers.CharField(max_length=64)
    sent_at = serializers.FloatField(required=False)
    gpus = serializers.ListField(child=serializers.DictField(), required=False)
    engines = serializers.ListField(child=serializers.DictField(), required=False)
    residency = serializers.ListField(child=serializers.DictField(), required=False)


class ReportResponseSerializer(serializers.Serializer):
    applied_seq = serializers.IntegerField()
    snapshot_requested = serializers.ListField(child=serializers.CharField())
    server_time = serializers.FloatField()
    deltas_applied = serializers.IntegerField()
    gpus_refused = serializers.ListField(
        child=serializers.CharField(), help_text="uuids of GPUs another node owns: not applied"
    )


class HeartbeatSerializer(serializers.Serializer):
    boot_id = serializers.CharField(max_length=64, required=False)
    sent_at = serializers.FloatField(required=False)
