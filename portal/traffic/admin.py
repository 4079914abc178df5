from django.contrib import admin

from portal.traffic.models import TrafficSample


@admin.register(TrafficSample)
class TrafficSampleAdmin(admin.ModelAdmin):
    list_display = ("name", "organization", "status", "detected_format", "size_bytes", "created_at")
    list_filter = ("status",)
    readonly_fields = ("profile", "charts")
