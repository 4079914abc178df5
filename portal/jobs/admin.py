from django.contrib import admin

from portal.jobs.models import ServedModel, Trial, TuningJob


@admin.register(ServedModel)
class ServedModelAdmin(admin.ModelAdmin):
    list_display = ("name", "organization", "path", "num_params")


class TrialInline(admin.TabularInline):
    model = Trial
    extra = 0
    fields = ("number", "label", "status", "attempts", "finished_at")
    readonly_fields = fields


@admin.register(TuningJob)
class TuningJobAdmin(admin.ModelAdmin):
    list_display = ("name", "organization", "status", "winner_trial", "created_at")
    list_filter = ("status",)
    inlines = [TrialInline]
