from django.apps import AppConfig


class ReviewConfig(AppConfig):
    name = "posttrain.review"
    label = "review"
    verbose_name = "Annotator review"
