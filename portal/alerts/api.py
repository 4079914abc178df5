"""REST API of alerts (routed from portal/api/urls.py): the organization's channels (owners and
admins manage them; a webhook's signing secret is returned once, when it is made) and its recent
alerts with each delivery's state."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from portal.accounts.models import Role
from portal.alerts import services
from portal.alerts.models import Alert, AlertChannel, AlertDelivery, AlertKind
from portal.restkit import fields as api_fields
from portal.restkit.base import TenantScopedMixin
from portal.restkit.parsers import StrictJSONParser


class ChannelSerializer(api_fields.ModelSerializer):
    kinds = serializers.ListField(child=serializers.ChoiceField(choices=AlertKind.choices), max_length=20)

    class Meta:
        model = AlertChannel
        fields = ["id", "kind", "name", "target", "kinds", "enabled", "created_at"]
        read_only_fields = ["id", "enabled", "created_at"]


class ChannelCreatedSerializer(ChannelSerializer):
    secret = api_fields.CharField(read_only=True, help_text="The webhook's signing secret; shown only now.")

    class Meta(ChannelSerializer.Meta):
        fields = [*ChannelSerializer.Meta.fields, "secret"]
        read_only_fields = [*ChannelSerializer.Meta.read_only_fields, "secret"]


class DeliverySerializer(api_fields.ModelSerializer):
    channel = api_fields.CharField(source="channel.name", read_only=True)

    class Meta:
        model = AlertDelivery
        fields = ["id", "channel", "status", "attempts", "last_status_code", "last_error", "delivered_at"]
        read_only_fields = fields


class AlertSerializer(api_fields.ModelSerializer):
    deliveries = DeliverySerializer(many=True, read_only=True)

    class Meta:
        model = Alert
        fields = ["id", "kind", "summary", "data", "created_at", "deliveries"]
        read_only_fields = fields


@extend_schema_view(post=extend_schema(request=ChannelSerializer, responses={201: ChannelCreatedSerializer}))
class ChannelListCreateView(TenantScopedMixin, generics.ListCreateAPIView):
    serializer_class = ChannelSerializer
    parser_classes = [StrictJSONParser]
    write_role = Role.ADMIN

    def tenant_queryset(self) -> QuerySet[AlertChannel]:
        return AlertChannel.objects.order_by("name")

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = ChannelSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        assert self.tenant is not None
        channel = services.alert_channel_create(
            actor=request.user,
            organization=self.tenant.organization,
            **serializer.validated_data,
        )
        return Response(ChannelCreatedSerializer(channel).data, status=status.HTTP_201_CREATED)


class ChannelDetailView(TenantScopedMixin, generics.RetrieveDestroyAPIView):
    serializer_class = ChannelSerializer
    write_role = Role.ADMIN

    def tenant_queryset(self) -> QuerySet[AlertChannel]:
        return AlertChannel.objects.all()

    def perform_destroy(self, instance: AlertChannel) -> None:
        services.alert_channel_delete(actor=self.request.user, channel=instance)


class AlertListView(TenantScopedMixin, generics.ListAPIView):
    """Recent alerts, newest first, each with its deliveries."""

    serializer_class = AlertSerializer

    def tenant_queryset(self) -> QuerySet[Alert]:
        return Alert.objects.prefetch_related("deliveries__channel").order_by("-created_at")
