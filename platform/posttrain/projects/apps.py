from django.apps import AppConfig


class ProjectsConfig(AppConfig):
    name = "posttrain.projects"
    label = "projects"
    verbose_name = "Projects and members"
