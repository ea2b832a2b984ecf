"""The dispatch worker: lanes, the global limit, retries, dead letters, the breaker."""

from postlane.worker.runner import Worker, WorkerConfig

__all__ = ["Worker", "WorkerConfig"]
