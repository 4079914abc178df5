from django.apps import AppConfig


class PoolsConfig(AppConfig):
    name = "portal.pools"
    label = "pools"
    verbose_name = "Hardware pools and engine hosts"
