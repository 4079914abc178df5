"""REST API of the pools app (routed from portal/api/urls.py): the pools an organization may
choose, its own pools' creation and changes, and each pool's hosts. Thin: services decide."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from portal.accounts.models import Role
from portal.pools import selectors, services
from portal.pools.models import Host, Pool
from portal.restkit import fields as api_fields
from portal.restkit.base import TenantScopedMixin


class HostSerializer(api_fields.ModelSerializer):
    health = serializers.SerializerMethodField()

    class Meta:
        model = Host
        fields = [
            "id",
            "name",
            "health",
            "state",
            "quarantine_reason",
            "facts",
            "last_heartbeat_at",
            "current_task",
            "last_task",
            "tasks_done",
        ]
        read_only_fields = fields

    def get_health(self, host: Host) -> str:
        return selectors.host_health(host)


class PoolSerializer(api_fields.ModelSerializer):
    shared = serializers.BooleanField(source="is_shared", read_only=True)
    live_hosts = serializers.SerializerMethodField()
    waiting = serializers.SerializerMethodField(
        help_text="Why work sent now would wait ('' if a host is live)."
    )

    class Meta:
        model = Pool
        fields = [
            "name",
            "shared",
            "region",
            "accelerator",
            "devices_per_host",
            "price_per_device_hour_usd",
            "endpoint_url_template",
            "bind_address",
            "runner",
            "k8s_namespace",
            "k8s_region",
            "enabled",
            "live_hosts",
            "waiting",
            "created_at",
        ]
        read_only_fields = fields

    def get_live_hosts(self, pool: Pool) -> int:
        return selectors.hosts_live(pool=pool).count()

    def get_waiting(self, pool: Pool) -> str:
        return selectors.pool_waiting_reason(pool=pool)


class PoolWriteSerializer(serializers.Serializer):
    name = api_fields.CharField(max_length=63)
    region = api_fields.CharField(max_length=32)
    accelerator = api_fields.CharField(max_length=64)
    devices_per_host = serializers.IntegerField(
        default=1, min_value=1, max_value=services.MAX_DEVICES_PER_HOST
    )
    # Checked by the service (above 0, or null: not priced), which names the rule.
    price_per_device_hour_usd = serializers.DecimalField(
        max_digits=10,
        decimal_places=4,
        default=None,
        allow_null=True,
        help_text="USD per device-hour, above 0; null (the default): the pool is not priced.",
    )
    endpoint_url_template = api_fields.CharField(max_length=300, default="http://127.0.0.1:{port}")
    bind_address = api_fields.CharField(max_length=64, default="127.0.0.1")
    runner = serializers.ChoiceField(choices=Pool._meta.get_field("runner").choices, default="local")
    k8s_namespace = api_fields.CharField(max_length=63, required=False, allow_blank=True, default="")
    k8s_region = api_fields.CharField(max_length=64, required=False, allow_blank=True, default="")


class PoolUpdateSerializer(PoolWriteSerializer):
    enabled = serializers.BooleanField(required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, partial=True, **kwargs)
        del self.fields["name"]


class _PoolView(TenantScopedMixin, generics.GenericAPIView):
    write_role = Role.ADMIN
    serializer_class = PoolSerializer

    def tenant_queryset(self) -> QuerySet[Any]:
        # Pools are not tenant rows (shared ones have no organization): looked up through the
        # selectors, which show the platform's pools and the tenant's own, never another's.
        return Pool.objects.none()

    def _pool(self, name: str) -> Pool:
        assert self.tenant is not None
        pool = selectors.pool_for(organization=self.tenant.organization, name=name)
        if pool is None:
            raise NotFound()
        return pool


class PoolListCreateView(_PoolView):
    """Pools this organization may tune and serve on; admins create the organization's own."""

    @extend_schema(responses=PoolSerializer(many=True))
    def get(self, request: Request) -> Response:
        assert self.tenant is not None
        pools = selectors.pools_for(organization=self.tenant.organization)
        return self.get_paginated_response(PoolSerializer(self.paginate_queryset(pools), many=True).data)

    @extend_schema(request=PoolWriteSerializer, responses={201: PoolSerializer})
    def post(self, request: Request) -> Response:
        assert self.tenant is not None
        serializer = PoolWriteSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        pool = services.pool_create(
            actor=request.user,
            owned_by=self.tenant.organization,
            **serializer.validated_data,
        )
        return Response(PoolSerializer(pool).data, status=status.HTTP_201_CREATED)


class PoolDetailView(_PoolView):
    @extend_schema(responses=PoolSerializer)
    def get(self, request: Request, name: str) -> Response:
        return Response(PoolSerializer(self._pool(name)).data)

    @extend_schema(request=PoolUpdateSerializer, responses=PoolSerializer)
    def patch(self, request: Request, name: str) -> Response:
        pool = self._pool(name)
        serializer = PoolUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        pool = services.pool_update(actor=request.user, pool=pool, **serializer.validated_data)
        return Response(PoolSerializer(pool).data)


class PoolHostListView(_PoolView):
    """The pool's hosts with their health and facts (only for the organization's own pools:
    the platform's hosts are the operator's business, shown in the admin console)."""

    @extend_schema(responses=HostSerializer(many=True))
    def get(self, request: Request, name: str) -> Response:
        pool = self._pool(name)
        hosts = pool.hosts.none() if pool.is_shared else pool.hosts.all()
        return self.get_paginated_response(HostSerializer(self.paginate_queryset(hosts), many=True).data)
