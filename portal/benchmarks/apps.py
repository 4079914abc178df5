from django.apps import AppConfig


class BenchmarksConfig(AppConfig):
    name = "portal.benchmarks"
    label = "benchmarks"
    verbose_name = "Benchmark reports"

    def ready(self) -> None:
        # Runs whose worker died (or whose message the broker lost), queued again by the one beat.
        from portal.benchmarks.services import benchmark_reports_recover
        from portal.outbox import recovery

        recovery.register("benchmark_reports", lambda now: benchmark_reports_recover(now=now))
