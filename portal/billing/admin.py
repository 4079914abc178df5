from django.contrib import admin

from portal.billing.models import BillingAccount, InvoiceCredit, UsageRecord, UsageReport, WebhookEvent


@admin.register(BillingAccount)
class BillingAccountAdmin(admin.ModelAdmin):
    list_display = ["organization", "status", "plan", "stripe_customer_id", "current_period_end"]
    readonly_fields = [f.name for f in BillingAccount._meta.fields]


@admin.register(UsageReport)
class UsageReportAdmin(admin.ModelAdmin):
    list_display = ["organization", "meter", "dimension", "hour", "sequence", "quantity", "status"]
    list_filter = ["status", "meter"]
    readonly_fields = [f.name for f in UsageReport._meta.fields]


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = ["organization", "meter", "dimension", "source", "hour", "duration_ms", "report"]
    readonly_fields = [f.name for f in UsageRecord._meta.fields]


@admin.register(WebhookEvent)
class WebhookEventAdmin(admin.ModelAdmin):
    list_display = ["stripe_event_id", "event_type", "outcome", "organization", "created_at"]
    readonly_fields = [f.name for f in WebhookEvent._meta.fields]


@admin.register(InvoiceCredit)
class InvoiceCreditAdmin(admin.ModelAdmin):
    list_display = ["organization", "key", "amount_cents", "currency", "period_start", "status", "sent_at"]
    list_filter = ["status"]
    readonly_fields = [f.name for f in InvoiceCredit._meta.fields]
