from django.apps import AppConfig


class BenchmarksConfig(AppConfig):
    name = "portal.benchmarks"
    label = "benchmarks"
    verbose_name = "Benchmark reports"
