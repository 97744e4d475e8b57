"""Posttrain's Django project. Lives in the platform/ source folder, which is never a package."""
