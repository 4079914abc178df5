from django.urls import path

from portal.jobs import views

app_name = "jobs"

urlpatterns = [
    path("", views.job_list, name="list"),
    path("models/", views.model_register, name="model_register"),
    path("what-if/", views.what_if, name="what_if"),
    path("<uuid:job_id>/", views.job_detail, name="detail"),
    path("<uuid:job_id>/trials/", views.job_trials, name="trials"),
    path("<uuid:job_id>/cancel/", views.job_cancel, name="cancel"),
    path("<uuid:job_id>/report/", views.job_report, name="report"),
    path("<uuid:job_id>/report/download.html", views.job_report_html, name="report_html"),
    path("<uuid:job_id>/report/download.pdf", views.job_report_pdf, name="report_pdf"),
]
