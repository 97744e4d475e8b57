"""Celery app and tasks. Tasks are thin: load by id, call one service."""
